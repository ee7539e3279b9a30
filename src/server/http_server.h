// HttpServer: a small HTTP/1.1 server on Boost.Beast / Asio, built for many long-lived streaming
// connections: a few I/O threads run an event loop; each connection is a strand (its handlers
// never run concurrently), so a thousand open SSE streams cost a thousand small objects, not a
// thousand threads.
//
// It knows nothing of OpenAI: it parses requests within HttpLimits, hands each complete request
// to the Handler, and gives the handler an Exchange to answer through, now or later, from any
// thread: one whole response, or a chunked stream of pieces (server-sent events). HEAD requests
// get headers only; HTTP/1.0 clients get streams delimited by closing the connection.
//
// Defences, each because some server fell to it (../shared/docs/reliability-checklist.md 4.1):
// header and body size caps (431 / 413 before the body is read), a deadline for the whole header
// (slowloris), Beast's strict parser (bad chunk sizes, Content-Length with Transfer-Encoding,
// duplicate lengths: 400), a per-stream cap on unsent bytes, a small kernel send buffer for
// streams and a write deadline (a client that stops reading is dropped, and its exchange is
// told), and a connection cap.
//
// A client that closes its connection while its request is in flight is noticed at once (the
// socket is watched for EOF while the handler works): the exchange's on-close callback runs, so
// the request can be aborted. Responses to pipelined requests go out in order.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace pagoda::server {

struct HttpLimits {
  size_t max_header_bytes = 16 * 1024;                // request line + headers -> 431
  size_t max_body_bytes = 32 * 1024 * 1024;           // -> 413
  std::chrono::milliseconds header_timeout{30000};    // from waiting for a request to its last header
  std::chrono::milliseconds body_timeout{60000};
  std::chrono::milliseconds write_timeout{30000};     // one write of a response or stream piece
  size_t max_unsent_stream_bytes = 4 * 1024 * 1024;   // a stream whose reader lags more is dropped
  // SO_SNDBUF of a streaming connection (the kernel doubles it; 0 = the kernel's autotuning, which
  // lets a stalled reader park up to tcp_wmem's maximum, 4 MiB, in the socket).
  size_t stream_send_buffer_bytes = 64 * 1024;
  size_t max_connections = 10000;                     // beyond it new connections are closed
};

struct HttpRequest {
  std::string method;  // as sent, e.g. "POST"
  std::string path;    // the target up to '?', exactly as sent (routing and auth both use it)
  std::string query;   // after '?', or ""
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  std::string remote;  // peer address, for logs

  // The first header of that (lower-case) name, or "".
  std::string_view header(std::string_view lower_name) const;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra, e.g. Retry-After
};

// The answer channel of one request. Thread-safe: every method may be called from any thread
// (work is posted to the connection's strand). Exactly one of respond() or begin_stream() ...
// end() should be used; calls after the exchange completed or the connection closed are ignored.
class Exchange {
 public:
  virtual ~Exchange() = default;
  virtual void respond(HttpResponse response) = 0;
  // Starts a chunked response (e.g. text/event-stream); write() sends pieces; end() finishes.
  virtual void begin_stream(int status, std::string content_type,
                            std::vector<std::pair<std::string, std::string>> headers) = 0;
  virtual void write(std::string piece) = 0;
  virtual void end() = 0;
  // Runs `fn` on the connection's strand (serialized with everything else of this connection).
  virtual void post(std::function<void()> fn) = 0;
  // `fn` runs once, on the strand, if the connection goes away before the exchange completes
  // (client closed, write deadline, reader too slow, server stopping). If it already went away,
  // `fn` is posted at once.
  virtual void on_close(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(HttpRequest&& request, std::shared_ptr<Exchange> exchange)>;

// Looks at a request's line and headers (its body is empty) before the body is read: a response
// returned here is sent at once and the connection closed, without reading the body (for 401,
// 404, 405: nobody gets to make the server buffer a body it will refuse). nullopt: go on.
using HttpHeadCheck = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;

class HttpServer {
 public:
  // Binds host:port (port 0 = any free port) and starts `threads` I/O threads. Fails naming the
  // address when it cannot bind.
  static Result<std::unique_ptr<HttpServer>> start(const std::string& host, uint16_t port, HttpHandler handler,
                                                   HttpHeadCheck head_check = nullptr, HttpLimits limits = {},
                                                   int threads = 2);
  ~HttpServer();  // stop(0)

  uint16_t port() const;
  size_t num_connections() const;
  // Closes the listening socket: no new connections; open ones carry on.
  void stop_accepting();
  // Closes every connection and joins the threads: idle ones at once, those with a response in
  // progress when it has gone out or after `grace`, whichever is first (then their exchanges'
  // on-close callbacks run). No new requests are read meanwhile.
  void stop(std::chrono::milliseconds grace);

  struct Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace pagoda::server
