// DisaggProxy: the front of a disaggregated deployment (`pagoda proxy`, the role of vLLM's
// disaggregated-prefill toy proxy). It serves the OpenAI completions and chat routes, and for each
// request:
//   1. sends it to a prefill instance with kv_transfer_params {"do_remote_decode": true} and
//      stream false (the instance computes the prompt and the first token and answers with the
//      kv_transfer_params that find its KV: kv_transfer/kv_transfer_params.h);
//   2. sends it, with those parameters, to a decode instance, and passes the decode instance's
//      answer back as it comes (streamed or whole).
// Instances are picked by fewest requests in flight (ties in turn). A prefill instance that
// cannot be reached or answers 5xx is marked down for a few seconds and the prefill is retried on
// another; a 4xx (a bad request) goes straight back to the client. A decode instance that cannot
// be reached is skipped the same way (nothing has been sent to the client yet). /health answers
// 200 while at least one instance of each kind is up, /metrics the proxy's own counters,
// /v1/models a decode instance's list.
//
// Each request runs on a thread of its own (blocking HTTP/1.1 to the instances); a client that
// disconnects closes its instance connections, which aborts the request there. Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda::server {

struct ProxyConfig {
  std::vector<std::string> prefill_urls;  // "http://host:port", at least one
  std::vector<std::string> decode_urls;   // at least one
  std::string host = "0.0.0.0";
  uint16_t port = 8000;
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds io_timeout{600000};   // one read or write to an instance
  std::chrono::milliseconds down_for{5000};       // how long a failed instance is skipped
};

class DisaggProxy {
 public:
  // Checks the URLs and starts listening; fails naming the bad URL or the address.
  static Result<std::unique_ptr<DisaggProxy>> start(const ProxyConfig& config);
  ~DisaggProxy();  // stop()

  uint16_t port() const;
  // Stops accepting, closes the instance connections of requests in flight and waits for them.
  void stop();

  struct Impl;

 private:
  explicit DisaggProxy(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::server
