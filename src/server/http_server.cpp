#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cctype>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace pagoda::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

std::string_view HttpRequest::header(std::string_view lower_name) const {
  for (const auto& [name, value] : headers) {
    if (name == lower_name) return value;
  }
  return {};
}

namespace {

class Session;

// What the I/O threads share.
struct Shared {
  net::io_context ioc;
  HttpHandler handler;
  HttpHeadCheck head_check;
  HttpLimits limits;
  std::atomic<size_t> connections{0};
  std::mutex mu;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions;  // guarded by mu
};

std::string reason_phrase(int status) {
  std::string_view r = http::obsolete_reason(static_cast<http::status>(status));
  return r.empty() || r == "<unknown-status>" ? "Status" : std::string(r);
}

// One connection. Every member function runs on the connection's strand.
class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<Shared> shared) : shared_(std::move(shared)), stream_(std::move(socket)) {
    beast::error_code ec;
    stream_.socket().set_option(tcp::no_delay(true), ec);
    stream_.socket().non_blocking(true, ec);  // for the EOF peek below
    auto ep = stream_.socket().remote_endpoint(ec);
    if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  }

  ~Session() {
    shared_->connections.fetch_sub(1);
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->sessions.erase(this);
  }

  void start() {
    {
      std::lock_guard<std::mutex> lock(shared_->mu);
      shared_->sessions[this] = weak_from_this();
    }
    read_request();
  }

  template <typename F>
  void run(F&& fn) {
    net::post(stream_.get_executor(), std::forward<F>(fn));
  }

  // --- the exchange API, called on the strand with the exchange's generation ---
  void respond(uint64_t gen, HttpResponse r) {
    if (!current(gen) || responding_) return;
    responding_ = true;
    std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) + "\r\n";
    out += "Content-Type: " + r.content_type + "\r\n";
    out += "Content-Length: " + std::to_string(r.body.size()) + "\r\n";
    for (const auto& [k, v] : r.headers) out += k + ": " + v + "\r\n";
    if (!keep_alive_ || closing_) out += "Connection: close\r\n";
    out += "\r\n";
    if (!head_) out += r.body;  // a HEAD answer has the headers of the GET one, no body
    finish_after_write_ = true;
    queue(std::move(out));
  }

  void begin_stream(uint64_t gen, int status, const std::string& type,
                    const std::vector<std::pair<std::string, std::string>>& headers) {
    if (!current(gen) || responding_) return;
    responding_ = true;
    streaming_ = true;
    // A small kernel send buffer, so that what a stalled reader leaves unsent stays in unsent_
    // (and under its cap) instead of in megabytes of socket buffer per connection.
    if (shared_->limits.stream_send_buffer_bytes > 0) {
      beast::error_code ec;
      stream_.socket().set_option(
          net::socket_base::send_buffer_size(static_cast<int>(shared_->limits.stream_send_buffer_bytes)), ec);
    }
    // HTTP/1.0 has no chunked encoding: the stream is then delimited by closing the connection.
    if (http10_) keep_alive_ = false;
    std::string out = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
    out += "Content-Type: " + type + "\r\nCache-Control: no-cache\r\n";
    if (!http10_) out += "Transfer-Encoding: chunked\r\n";
    for (const auto& [k, v] : headers) out += k + ": " + v + "\r\n";
    if (!keep_alive_ || closing_) out += "Connection: close\r\n";
    out += "\r\n";
    queue(std::move(out));
  }

  void write(uint64_t gen, const std::string& piece) {
    if (!current(gen) || !streaming_ || piece.empty()) return;
    if (http10_) {
      queue(piece);
      return;
    }
    char size[32];
    snprintf(size, sizeof size, "%zx\r\n", piece.size());
    queue(size + piece + "\r\n");
  }

  void end(uint64_t gen) {
    if (!current(gen) || !streaming_) return;
    streaming_ = false;
    finish_after_write_ = true;
    queue(http10_ ? std::string() : std::string("0\r\n\r\n"));
  }

  void on_close(uint64_t gen, std::function<void()> fn) {
    if (gen != gen_) return;  // that exchange already completed
    if (closed_) {
      run(std::move(fn));
      return;
    }
    on_close_ = std::move(fn);
  }

  // Half-closes, then reads and drops what the client still sends, for up to a second or 1 MiB.
  void linger_close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.expires_after(std::chrono::seconds(1));
    drain_.resize(64 * 1024);
    drain(0);
  }
  void drain(size_t total) {
    stream_.async_read_some(net::buffer(drain_), [self = shared_from_this(), total](beast::error_code ec, size_t n) {
      if (ec || total + n > (1u << 20)) {
        self->close();
        return;
      }
      self->drain(total + n);
    });
  }

  // Shutting down: close now if nothing is in progress, else once the current response is out.
  void close_when_idle() {
    closing_ = true;
    if (!handling_ && !writing_ && pending_.empty()) close();
  }

  // Closes the connection; the current exchange, if any, hears of it.
  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
    if (on_close_) {
      auto fn = std::move(on_close_);
      on_close_ = nullptr;
      fn();
    }
  }

 private:
  bool current(uint64_t gen) const { return gen == gen_ && handling_ && !closed_; }

  void read_request() {
    if (closed_) return;
    if (closing_) {
      close();
      return;
    }
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(std::min<size_t>(shared_->limits.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(shared_->limits.max_body_bytes);
    stream_.expires_after(shared_->limits.header_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // Answers a request that could not be read, then closes. The close lingers: unread bytes at
  // close() would make the kernel send a reset, which can destroy the answer before the client
  // reads it.
  void reject(int status, const std::string& message) {
    HttpResponse r;
    r.status = status;
    r.body = R"({"error":{"message":")" + message + R"(","type":"invalid_request_error","param":null,"code":null}})";
    reject(std::move(r));
  }
  void reject(HttpResponse r) {
    handling_ = true;
    responding_ = false;
    keep_alive_ = false;
    linger_ = true;
    respond(gen_, std::move(r));
  }

  bool read_failed(beast::error_code ec) {
    if (!ec) return false;
    if (ec == http::error::header_limit) {
      reject(431, "request header fields too large");
    } else if (ec == http::error::body_limit) {
      reject(413, "request body too large");
    } else if (ec == http::error::end_of_stream || ec == beast::error::timeout || ec == net::error::eof ||
               ec == net::error::operation_aborted || ec == net::error::connection_reset || closed_) {
      close();
    } else {
      reject(400, "malformed HTTP request");
    }
    return true;
  }

  // The request line and headers, without the body.
  HttpRequest head_of(const http::request<http::string_body>& req) const {
    HttpRequest r;
    r.method = std::string(req.method_string());
    std::string_view target(req.target().data(), req.target().size());
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    for (const auto& f : req) {
      std::string name(f.name_string());
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      r.headers.emplace_back(std::move(name), std::string(f.value()));
    }
    r.remote = remote_;
    return r;
  }

  void on_header(beast::error_code ec) {
    if (read_failed(ec)) return;
    auto& req = parser_->get();
    head_ = req.method() == http::verb::head;
    http10_ = req.version() < 11;
    // Refusals that need no body (authentication, unknown route, method) are answered before
    // the body is read, so an unauthenticated client cannot make the server buffer one.
    if (shared_->head_check) {
      std::optional<HttpResponse> refusal;
      try {
        refusal = shared_->head_check(head_of(req));
      } catch (...) {
        refusal = HttpResponse{500, "application/json",
                               R"({"error":{"message":"internal server error","type":"server_error","param":null,"code":null}})",
                               {}};
      }
      if (refusal) {
        reject(std::move(*refusal));
        return;
      }
    }
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      // curl and others wait for this before sending a large body.
      queue_raw("HTTP/1.1 100 Continue\r\n\r\n");
    }
    stream_.expires_after(shared_->limits.body_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_body(ec); });
  }

  void on_body(beast::error_code ec) {
    if (read_failed(ec)) return;
    auto req = parser_->release();
    HttpRequest r = head_of(req);
    r.body = std::move(req.body());
    keep_alive_ = req.keep_alive();
    ++gen_;
    handling_ = true;
    responding_ = false;
    watch_for_close();
    auto exchange = make_exchange();
    try {
      shared_->handler(std::move(r), exchange);
    } catch (...) {  // a handler bug must not take the server down
      HttpResponse err;
      err.status = 500;
      err.body = R"({"error":{"message":"internal server error","type":"server_error","param":null,"code":null}})";
      respond(gen_, std::move(err));
    }
  }

  // While a request is being handled, nothing is read; a readable socket then means EOF (the
  // client left) or a pipelined request (which waits its turn).
  void watch_for_close() {
    if (buffer_.size() > 0) return;  // a pipelined request is already here
    stream_.socket().async_wait(tcp::socket::wait_read, [self = shared_from_this(), gen = gen_](beast::error_code ec) {
      if (!self->current(gen)) return;
      if (ec) {
        self->close();
        return;
      }
      char c;
      beast::error_code pec;
      const size_t n = self->stream_.socket().receive(net::buffer(&c, 1), tcp::socket::message_peek, pec);
      if (pec == net::error::would_block || pec == net::error::try_again) {
        self->watch_for_close();
      } else if (pec || n == 0) {
        self->close();
      }  // else: pipelined bytes; read after this exchange
    });
  }

  std::shared_ptr<Exchange> make_exchange();

  void queue(std::string data) {
    unsent_ += data.size();
    pending_.push_back(std::move(data));
    if (streaming_ && unsent_ > shared_->limits.max_unsent_stream_bytes) {
      close();  // the reader stopped reading; let the request go
      return;
    }
    flush();
  }
  void queue_raw(std::string data) { queue(std::move(data)); }

  void flush() {
    if (writing_ || closed_ || pending_.empty()) return;
    writing_ = true;
    inflight_.clear();
    for (auto& p : pending_) inflight_ += p;
    pending_.clear();
    stream_.expires_after(shared_->limits.write_timeout);
    net::async_write(stream_, net::buffer(inflight_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->on_write(ec, n);
    });
  }

  void on_write(beast::error_code ec, size_t n) {
    writing_ = false;
    unsent_ -= std::min(unsent_, n);
    if (ec) {
      close();
      return;
    }
    if (!pending_.empty()) {
      flush();
      return;
    }
    if (finish_after_write_) {
      finish_after_write_ = false;
      handling_ = false;
      responding_ = false;
      streaming_ = false;
      on_close_ = nullptr;
      ++gen_;
      if (keep_alive_ && !closing_) {
        read_request();
      } else if (linger_) {
        linger_close();
      } else {
        close();
      }
    }
  }

  std::shared_ptr<Shared> shared_;  // before stream_: the socket must go before its io_context
  beast::tcp_stream stream_;
  std::string remote_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  uint64_t gen_ = 0;           // the exchange in progress (bumped when one completes)
  bool handling_ = false;      // a request is with the handler, or its response is going out
  bool responding_ = false;    // respond() or begin_stream() was called for it
  bool streaming_ = false;
  bool keep_alive_ = true;
  bool head_ = false;          // the request is a HEAD: answers carry no body
  bool http10_ = false;        // an HTTP/1.0 client: streams are not chunked
  bool finish_after_write_ = false;
  bool closed_ = false;
  bool closing_ = false;       // the server is stopping: no further requests on this connection
  bool linger_ = false;        // close with linger_close() after the response
  std::vector<char> drain_;
  bool writing_ = false;
  std::function<void()> on_close_;
  std::deque<std::string> pending_;
  std::string inflight_;
  size_t unsent_ = 0;
};

class SessionExchange : public Exchange {
 public:
  SessionExchange(std::shared_ptr<Session> s, uint64_t gen) : s_(std::move(s)), gen_(gen) {}
  void respond(HttpResponse r) override {
    s_->run([s = s_, g = gen_, r = std::move(r)]() mutable { s->respond(g, std::move(r)); });
  }
  void begin_stream(int status, std::string type, std::vector<std::pair<std::string, std::string>> headers) override {
    s_->run([s = s_, g = gen_, status, type = std::move(type), headers = std::move(headers)] {
      s->begin_stream(g, status, type, headers);
    });
  }
  void write(std::string piece) override {
    s_->run([s = s_, g = gen_, piece = std::move(piece)] { s->write(g, piece); });
  }
  void end() override {
    s_->run([s = s_, g = gen_] { s->end(g); });
  }
  void post(std::function<void()> fn) override { s_->run(std::move(fn)); }
  void on_close(std::function<void()> fn) override {
    s_->run([s = s_, g = gen_, fn = std::move(fn)]() mutable { s->on_close(g, std::move(fn)); });
  }

 private:
  std::shared_ptr<Session> s_;
  uint64_t gen_;
};

std::shared_ptr<Exchange> Session::make_exchange() {
  return std::make_shared<SessionExchange>(shared_from_this(), gen_);
}

}  // namespace

struct HttpServer::Impl {
  std::shared_ptr<Shared> shared = std::make_shared<Shared>();
  // The acceptor and its retry timer live on one strand, so closing it never races an accept.
  net::strand<net::io_context::executor_type> accept_strand = net::make_strand(shared->ioc);
  std::optional<tcp::acceptor> acceptor;
  std::optional<net::steady_timer> retry;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::vector<std::thread> threads;
  uint16_t port = 0;
  bool stopped = false;

  void accept() {
    acceptor->async_accept(net::make_strand(shared->ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor->is_open()) return;
      if (ec) {
        // Out of descriptors (EMFILE) and the like: the listening socket stays readable, so
        // accepting again at once would spin; wait a little for connections to close.
        retry->expires_after(std::chrono::milliseconds(100));
        retry->async_wait([this](beast::error_code wec) {
          if (!wec && acceptor->is_open()) accept();
        });
        return;
      }
      if (shared->connections.fetch_add(1) >= shared->limits.max_connections) {
        shared->connections.fetch_sub(1);
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        auto session = std::make_shared<Session>(std::move(socket), shared);
        session->run([session] { session->start(); });  // on its own strand, like all it does
      }
      accept();
    });
  }
};

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

HttpServer::~HttpServer() {
  stop(std::chrono::milliseconds(0));
  // Handlers posted after stop() (e.g. an engine still delivering chunks to closed connections)
  // hold their sessions, which hold the io_context: run them now so that nothing is left.
  impl_->shared->ioc.restart();
  while (impl_->shared->ioc.poll() > 0) {
  }
}

Result<std::unique_ptr<HttpServer>> HttpServer::start(const std::string& host, uint16_t port, HttpHandler handler,
                                                      HttpHeadCheck head_check, HttpLimits limits, int threads) {
  auto impl = std::make_unique<Impl>();
  impl->shared->handler = std::move(handler);
  impl->shared->head_check = std::move(head_check);
  impl->shared->limits = limits;
  beast::error_code ec;
  const auto address = net::ip::make_address(host, ec);
  if (ec) return invalid_argument("--host '" + host + "' is not an IP address");
  const tcp::endpoint endpoint(address, port);
  impl->acceptor.emplace(impl->accept_strand);
  impl->retry.emplace(impl->accept_strand);
  const std::string where = host + ":" + std::to_string(port);
  impl->acceptor->open(endpoint.protocol(), ec);
  if (!ec) impl->acceptor->set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) impl->acceptor->bind(endpoint, ec);
  if (!ec) impl->acceptor->listen(net::socket_base::max_listen_connections, ec);
  if (ec) return Status(StatusCode::kIoError, "cannot listen on " + where + ": " + ec.message());
  impl->port = impl->acceptor->local_endpoint().port();
  impl->work.emplace(net::make_work_guard(impl->shared->ioc));
  impl->accept();
  for (int i = 0; i < std::max(1, threads); ++i) {
    impl->threads.emplace_back([shared = impl->shared] { shared->ioc.run(); });
  }
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

uint16_t HttpServer::port() const { return impl_->port; }

size_t HttpServer::num_connections() const { return impl_->shared->connections.load(); }

void HttpServer::stop_accepting() {
  if (impl_->stopped) return;  // the threads are gone, and so is the listener
  std::promise<void> done;
  net::post(impl_->accept_strand, [this, &done] {
    beast::error_code ec;
    if (impl_->acceptor) impl_->acceptor->close(ec);
    if (impl_->retry) impl_->retry->cancel();
    done.set_value();
  });
  done.get_future().wait();
}

void HttpServer::stop(std::chrono::milliseconds grace) {
  if (impl_->stopped) return;
  stop_accepting();
  impl_->stopped = true;
  std::vector<std::shared_ptr<Session>> open;
  {
    std::lock_guard<std::mutex> lock(impl_->shared->mu);
    for (auto& [_, weak] : impl_->shared->sessions) {
      if (auto s = weak.lock()) open.push_back(std::move(s));
    }
  }
  // Idle connections close now; one with a response going out closes when it is out.
  for (auto& s : open) s->run([s] { s->close_when_idle(); });
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (impl_->shared->connections.load() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  for (auto& s : open) s->run([s] { s->close(); });
  open.clear();
  impl_->work.reset();
  const auto hard = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (impl_->shared->connections.load() > 0 && std::chrono::steady_clock::now() < hard) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  impl_->shared->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace pagoda::server
