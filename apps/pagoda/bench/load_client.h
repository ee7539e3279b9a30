// The load generator of `pagoda bench serve`: streams requests to an OpenAI-compatible server on
// one thread with an Asio event loop (a connection per request, no thread per request), at the
// given arrival times and under a concurrency cap, and records what vLLM's benchmark records:
// the time of every streamed chunk that carries text, and the token counts of the server's usage.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "apps/pagoda/bench/serve_stats.h"
#include "base/status.h"

namespace pagoda::app::bench {

struct Target {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  std::string path = "/v1/completions";  // or /v1/chat/completions
  std::vector<std::pair<std::string, std::string>> headers;  // e.g. Authorization
};

// "http://host:port" (an optional path after it is ignored) -> host and port.
Result<Target> parse_base_url(const std::string& url);

struct LoadOptions {
  int64_t max_concurrency = 0;      // 0 = no cap
  double request_timeout_s = 3600;  // one request, start to end
  // Called on the loop thread after each request ends, with the number ended so far.
  std::function<void(size_t)> on_done;
};

// Sends bodies[i] (a JSON request with "stream": true) at arrivals[i] seconds after the start
// (later when max_concurrency requests are in flight) and returns one record per body, in order.
// `duration` gets the time from the start to the end of the last request.
std::vector<RequestRecord> run_load(const Target& target, const std::vector<std::string>& bodies,
                                    const std::vector<double>& arrivals, const LoadOptions& options,
                                    double* duration);

// One blocking request (for /tokenize, /detokenize, /v1/models, /metrics): the status and body.
struct SimpleResponse {
  int status = 0;
  std::string body;
};
Result<SimpleResponse> simple_request(const Target& target, const std::string& method, const std::string& path,
                                      const std::string& body);

}  // namespace pagoda::app::bench
