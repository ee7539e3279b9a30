#include "server/disagg_proxy.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/log.h"
#include "metrics/registry.h"
#include "server/http_server.h"

namespace pagoda::server {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Instance {
  std::string url, host, port;
  std::string role;  // "prefill" or "decode"
  std::atomic<int> in_flight{0};
  std::atomic<int64_t> down_until{0};  // steady-clock milliseconds
  metrics::Gauge* in_flight_gauge = nullptr;
  metrics::Counter* failures = nullptr;
};

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

Result<std::unique_ptr<Instance>> parse_url(const std::string& url, const std::string& role) {
  std::string rest = url;
  if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  if (rest.empty() || colon == std::string::npos || colon == 0 || colon + 1 == rest.size()) {
    return invalid_argument("--" + role + ": '" + url + "' is not http://host:port");
  }
  auto i = std::make_unique<Instance>();
  i->url = url;
  i->host = rest.substr(0, colon);
  i->port = rest.substr(colon + 1);
  i->role = role;
  return i;
}

std::string error_body(const std::string& message, const std::string& type, int code) {
  json e = {{"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", code}}}};
  return e.dump();
}

// One HTTP/1.1 exchange with an instance, on a blocking socket.
class Upstream {
 public:
  Upstream(asio::io_context& io, const ProxyConfig& config) : socket_(io), config_(config) {}

  Status connect(const Instance& to) {
    boost::system::error_code ec;
    tcp::resolver resolver(socket_.get_executor());
    const auto endpoints = resolver.resolve(to.host, to.port, ec);
    if (ec) return unavailable(to.url + ": " + ec.message());
    std::string why = "no address";
    // A bounded connect: non-blocking with a wait, then blocking reads and writes with timeouts.
    for (const auto& e : endpoints) {
      socket_.open(e.endpoint().protocol(), ec);
      if (ec) continue;
      socket_.non_blocking(true, ec);
      socket_.connect(e.endpoint(), ec);
      if (ec == asio::error::would_block || ec == asio::error::in_progress) {
        pollfd p{socket_.native_handle(), POLLOUT, 0};
        if (::poll(&p, 1, static_cast<int>(config_.connect_timeout.count())) != 1) {
          ec = asio::error::timed_out;
        } else {
          int err = 0;
          socklen_t len = sizeof err;
          ::getsockopt(socket_.native_handle(), SOL_SOCKET, SO_ERROR, &err, &len);
          ec = err != 0 ? boost::system::error_code(err, boost::system::system_category()) : boost::system::error_code();
        }
      }
      if (!ec) {
        socket_.non_blocking(false, ec);
        set_timeouts(config_.io_timeout);
        return Status::ok_status();
      }
      why = ec.message();
      boost::system::error_code ignored;
      socket_.close(ignored);
    }
    return unavailable(to.url + ": cannot connect (" + why + ")");
  }

  // `authorization`: the client's header, passed on (instances started with --api-key want it).
  Status send(const std::string& method, const std::string& path, const std::string& host, const std::string& body,
              std::string_view authorization = {}) {
    http::request<http::string_body> req{method == "GET" ? http::verb::get : http::verb::post, path, 11};
    req.set(http::field::host, host);
    req.set(http::field::content_type, "application/json");
    if (!authorization.empty()) req.set(http::field::authorization, authorization);
    req.body() = body;
    req.prepare_payload();
    boost::system::error_code ec;
    http::write(socket_, req, ec);
    return ec ? unavailable("sending: " + ec.message()) : Status::ok_status();
  }

  // Reads the header; then the body piece by piece into on_piece.
  Status read_header(int* status, std::string* content_type) {
    boost::system::error_code ec;
    parser_.body_limit(boost::none);
    http::read_header(socket_, buffer_, parser_, ec);
    if (ec) return unavailable("reading the answer: " + ec.message());
    *status = static_cast<int>(parser_.get().result_int());
    *content_type = std::string(parser_.get()[http::field::content_type]);
    return Status::ok_status();
  }

  Status read_body(const std::function<void(std::string_view)>& on_piece) {
    char piece[16384];
    while (!parser_.is_done()) {
      parser_.get().body().data = piece;
      parser_.get().body().size = sizeof piece;
      boost::system::error_code ec;
      // read_some: whatever has arrived goes on at once (read() would wait to fill the piece,
      // holding streamed tokens back).
      http::read_some(socket_, buffer_, parser_, ec);
      if (ec == http::error::need_buffer) ec = {};
      if (ec) return unavailable("reading the answer: " + ec.message());
      const size_t n = sizeof piece - parser_.get().body().size;
      if (n > 0) on_piece(std::string_view(piece, n));
    }
    return Status::ok_status();
  }

  Status read_all(std::string* body) {
    return read_body([&](std::string_view p) { body->append(p); });
  }

  // From another thread: makes every blocking call on the socket return.
  void abort() { ::shutdown(socket_.native_handle(), SHUT_RDWR); }

 private:
  void set_timeouts(std::chrono::milliseconds t) {
    timeval tv{static_cast<time_t>(t.count() / 1000), static_cast<suseconds_t>((t.count() % 1000) * 1000)};
    ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    ::setsockopt(socket_.native_handle(), SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  }

  tcp::socket socket_;
  const ProxyConfig& config_;
  boost::beast::flat_buffer buffer_;
  http::response_parser<http::buffer_body> parser_;
};

}  // namespace

struct DisaggProxy::Impl {
  ProxyConfig config;
  std::vector<std::unique_ptr<Instance>> prefill, decode;
  metrics::Registry registry;
  metrics::CounterFamily* requests = nullptr;  // outcome
  metrics::Counter* prefill_retries = nullptr;
  std::unique_ptr<HttpServer> http;
  std::atomic<uint64_t> turn{0};

  std::mutex mu;
  std::condition_variable idle;
  int active = 0;            // guarded by mu
  bool stopping = false;     // guarded by mu
  std::vector<Upstream*> upstreams;  // in use, guarded by mu (aborted at stop)

  // The instance of `pool` with the fewest requests in flight among those up (ties in turn),
  // skipping `tried`; null when none is left.
  Instance* pick(std::vector<std::unique_ptr<Instance>>& pool, const std::vector<Instance*>& tried) {
    const int64_t now = now_ms();
    Instance* best = nullptr;
    const size_t n = pool.size();
    const size_t start = turn.fetch_add(1) % n;
    for (bool allow_down : {false, true}) {
      for (size_t k = 0; k < n; ++k) {
        Instance* i = pool[(start + k) % n].get();
        if (std::find(tried.begin(), tried.end(), i) != tried.end()) continue;
        if (!allow_down && i->down_until.load() > now) continue;
        if (best == nullptr || i->in_flight.load() < best->in_flight.load()) best = i;
      }
      if (best != nullptr) return best;
    }
    return nullptr;
  }

  void mark_down(Instance* i, const std::string& why) {
    i->down_until = now_ms() + config.down_for.count();
    i->failures->inc();
    log_line(LogLevel::kWarning, "proxy", i->role + " instance " + i->url + ": " + why);
  }

  void count(const char* outcome) { requests->with_labels({outcome}).inc(); }

  void handle(HttpRequest request, std::shared_ptr<Exchange> exchange);
  void generate(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
  void forward_get(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange);
};

namespace {

// Keeps an instance counted as busy, and an upstream registered for stop(), for a scope.
struct Busy {
  Instance* i;
  explicit Busy(Instance* instance) : i(instance) {
    i->in_flight.fetch_add(1);
    i->in_flight_gauge->inc();
  }
  ~Busy() {
    i->in_flight.fetch_sub(1);
    i->in_flight_gauge->dec();
  }
};

}  // namespace

void DisaggProxy::Impl::forward_get(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  const std::string& path = request.path;
  asio::io_context io;
  std::vector<Instance*> tried;
  // As in generate(): a client (or stop()) that goes away aborts the instance connection.
  struct Cancel {
    std::mutex mu;
    Upstream* current = nullptr;
    bool closed = false;
  };
  auto cancel = std::make_shared<Cancel>();
  exchange->on_close([cancel] {
    std::lock_guard<std::mutex> lock(cancel->mu);
    cancel->closed = true;
    if (cancel->current != nullptr) cancel->current->abort();
  });
  while (Instance* d = pick(decode, tried)) {
    tried.push_back(d);
    Upstream up(io, config);
    {
      std::lock_guard<std::mutex> lock(cancel->mu);
      if (cancel->closed) return;
      cancel->current = &up;
    }
    struct Clear {
      Cancel& c;
      ~Clear() {
        std::lock_guard<std::mutex> lock(c.mu);
        c.current = nullptr;
      }
    } clear{*cancel};
    int status = 0;
    std::string type, body;
    if (Status st = up.connect(*d); !st.ok()) {
      mark_down(d, st.message());
      continue;
    }
    if (up.send("GET", path, d->host, "", request.header("authorization")).ok() && up.read_header(&status, &type).ok() && up.read_all(&body).ok()) {
      exchange->respond(HttpResponse{status, type.empty() ? "application/json" : type, body, {}});
      return;
    }
    mark_down(d, "no answer to GET " + path);
  }
  exchange->respond(HttpResponse{503, "application/json", error_body("no decode instance answered", "ServiceUnavailableError", 503), {}});
}

void DisaggProxy::Impl::generate(const HttpRequest& request, const std::shared_ptr<Exchange>& exchange) {
  json body;
  try {
    body = json::parse(request.body);
  } catch (const json::exception& e) {
    count("bad_request");
    exchange->respond(HttpResponse{400, "application/json", error_body(std::string("invalid JSON: ") + e.what(), "BadRequestError", 400), {}});
    return;
  }
  if (!body.is_object()) {
    count("bad_request");
    exchange->respond(HttpResponse{400, "application/json", error_body("the body must be a JSON object", "BadRequestError", 400), {}});
    return;
  }
  asio::io_context io;
  // The client's connection going away aborts the instance connection in use (the callback may
  // run after this function returns, so what it touches is shared).
  struct Cancel {
    std::atomic<bool> closed{false};
    std::mutex mu;
    Upstream* current = nullptr;  // guarded by mu; cleared before the Upstream goes
  };
  auto cancel = std::make_shared<Cancel>();
  exchange->on_close([cancel] {
    cancel->closed = true;
    std::lock_guard<std::mutex> lock(cancel->mu);
    if (cancel->current != nullptr) cancel->current->abort();
  });
  const std::atomic<bool>& closed = cancel->closed;
  auto use = [&](Upstream* u) {
    std::lock_guard<std::mutex> lock(cancel->mu);
    cancel->current = u;
    if (u != nullptr && closed) u->abort();
  };

  // 1. Prefill, retried on another instance when one fails.
  json prefill_body = body;
  prefill_body["kv_transfer_params"] = {{"do_remote_decode", true}};
  prefill_body["stream"] = false;
  prefill_body.erase("stream_options");
  const std::string prefill_text = prefill_body.dump();
  json kv;
  std::vector<Instance*> tried;
  while (kv.is_null()) {
    Instance* p = pick(prefill, tried);
    if (p == nullptr || closed) break;
    if (!tried.empty()) prefill_retries->inc();
    tried.push_back(p);
    Busy busy(p);
    Upstream up(io, config);
    use(&up);
    int status = 0;
    std::string type, answer;
    Status st = up.connect(*p);
    if (st.ok()) st = up.send("POST", request.path, p->host, prefill_text, request.header("authorization"));
    if (st.ok()) st = up.read_header(&status, &type);
    if (st.ok()) st = up.read_all(&answer);
    use(nullptr);
    if (!st.ok() || status >= 500) {
      if (!closed) mark_down(p, st.ok() ? "answered " + std::to_string(status) : st.message());
      continue;
    }
    if (status != 200) {  // the request itself is bad: every instance would say so
      count("bad_request");
      exchange->respond(HttpResponse{status, type.empty() ? "application/json" : type, answer, {}});
      return;
    }
    try {
      kv = json::parse(answer).at("kv_transfer_params");
    } catch (const json::exception&) {
      kv = nullptr;
    }
    if (!kv.is_object()) {
      mark_down(p, "answered without kv_transfer_params (is it started with --kv-transfer-config kv_producer?)");
      kv = nullptr;
    } else if (kv.contains("remote_host") && kv["remote_host"].is_string() &&
               (kv["remote_host"] == "0.0.0.0" || kv["remote_host"] == "::")) {
      kv["remote_host"] = p->host;  // it listens everywhere: reach it where the proxy did
    }
  }
  if (closed) {
    count("client_closed");
    return;
  }
  if (kv.is_null()) {
    count("no_prefill");
    exchange->respond(HttpResponse{503, "application/json", error_body("no prefill instance answered", "ServiceUnavailableError", 503), {}});
    return;
  }

  // 2. Decode, streamed back as it comes.
  json decode_body = body;
  decode_body["kv_transfer_params"] = kv;
  const std::string decode_text = decode_body.dump();
  tried.clear();
  while (Instance* d = pick(decode, tried)) {
    if (closed) break;
    tried.push_back(d);
    Busy busy(d);
    Upstream up(io, config);
    use(&up);
    int status = 0;
    std::string type;
    Status st = up.connect(*d);
    if (st.ok()) st = up.send("POST", request.path, d->host, decode_text, request.header("authorization"));
    if (st.ok()) st = up.read_header(&status, &type);
    if (!st.ok() || status == 502 || status == 503) {
      use(nullptr);
      if (!closed) mark_down(d, st.ok() ? "answered " + std::to_string(status) : st.message());
      continue;  // nothing has reached the client yet
    }
    const bool streaming = type.rfind("text/event-stream", 0) == 0;
    if (streaming) {
      exchange->begin_stream(status, type, {});
      st = up.read_body([&](std::string_view piece) { exchange->write(std::string(piece)); });
      exchange->end();
    } else {
      std::string answer;
      st = up.read_all(&answer);
      if (st.ok()) exchange->respond(HttpResponse{status, type.empty() ? "application/json" : type, answer, {}});
    }
    use(nullptr);
    if (!st.ok() && !closed) {
      // Cut off midway: the client sees its stream end early (or the connection close).
      mark_down(d, st.message());
      count("decode_failed");
      if (!streaming) exchange->respond(HttpResponse{502, "application/json", error_body("the decode instance failed: " + st.message(), "BadGatewayError", 502), {}});
      return;
    }
    count(closed ? "client_closed" : "ok");
    return;
  }
  count(closed ? "client_closed" : "no_decode");
  exchange->respond(HttpResponse{503, "application/json", error_body("no decode instance answered", "ServiceUnavailableError", 503), {}});
}

void DisaggProxy::Impl::handle(HttpRequest request, std::shared_ptr<Exchange> exchange) {
  {
    std::lock_guard<std::mutex> lock(mu);
    // One thread a request, so a bound on them.
    constexpr int kMaxActive = 1024;
    if (stopping || active >= kMaxActive) {
      exchange->respond(HttpResponse{503, "application/json",
                                     error_body(stopping ? "the proxy is stopping" : "too many requests in flight",
                                                "ServiceUnavailableError", 503),
                                     {}});
      return;
    }
    ++active;
  }
  std::thread([this, request = std::move(request), exchange = std::move(exchange)]() mutable {
    if (request.method == "POST" && (request.path == "/v1/completions" || request.path == "/v1/chat/completions")) {
      generate(request, exchange);
    } else if (request.method == "GET" && request.path == "/health") {
      const int64_t now = now_ms();
      auto up = [&](const std::vector<std::unique_ptr<Instance>>& pool) {
        return std::any_of(pool.begin(), pool.end(), [&](const auto& i) { return i->down_until.load() <= now; });
      };
      const bool ok = up(prefill) && up(decode);
      exchange->respond(HttpResponse{ok ? 200 : 503, "application/json", ok ? "{}" : error_body("no prefill or no decode instance is up", "ServiceUnavailableError", 503), {}});
    } else if (request.method == "GET" && request.path == "/metrics") {
      exchange->respond(HttpResponse{200, "text/plain; version=0.0.4; charset=utf-8", registry.render(), {}});
    } else if (request.method == "GET" && (request.path == "/v1/models" || request.path == "/version")) {
      forward_get(request, exchange);
    } else {
      exchange->respond(HttpResponse{404, "application/json", error_body("no route " + request.method + " " + request.path, "NotFoundError", 404), {}});
    }
    // The exchange holds the connection, which lives on the HTTP server's threads: let go of it
    // before stop() may take the server down.
    exchange.reset();
    request = HttpRequest{};
    std::lock_guard<std::mutex> lock(mu);
    --active;
    idle.notify_all();
  }).detach();
}

Result<std::unique_ptr<DisaggProxy>> DisaggProxy::start(const ProxyConfig& config) {
  if (config.prefill_urls.empty() || config.decode_urls.empty()) {
    return invalid_argument("pagoda proxy needs at least one --prefill and one --decode instance");
  }
  auto impl = std::make_unique<Impl>();
  impl->config = config;
  impl->requests = &impl->registry.add_counter("pagoda_proxy_requests", "Requests by outcome.", {"outcome"});
  impl->prefill_retries = &impl->registry.add_counter("pagoda_proxy_prefill_retries",
                                                      "Prefills sent again to another instance after one failed.", {})
                               .with_labels({});
  auto& in_flight = impl->registry.add_gauge("pagoda_proxy_in_flight", "Requests in flight per instance.", {"role", "instance"});
  auto& failures = impl->registry.add_counter("pagoda_proxy_instance_failures",
                                              "Times an instance could not be reached or failed.", {"role", "instance"});
  for (const auto& [urls, role, pool] : {std::tuple{&config.prefill_urls, "prefill", &impl->prefill},
                                         std::tuple{&config.decode_urls, "decode", &impl->decode}}) {
    for (const std::string& url : *urls) {
      PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<Instance> i, parse_url(url, role));
      i->in_flight_gauge = &in_flight.with_labels({role, url});
      i->failures = &failures.with_labels({role, url});
      pool->push_back(std::move(i));
    }
  }
  for (const char* outcome : {"ok", "bad_request", "no_prefill", "no_decode", "decode_failed", "client_closed"}) {
    impl->requests->with_labels({outcome});
  }
  Impl* raw = impl.get();
  PAGODA_ASSIGN_OR_RETURN(impl->http, HttpServer::start(config.host, config.port,
                                                        [raw](HttpRequest&& r, std::shared_ptr<Exchange> e) {
                                                          raw->handle(std::move(r), std::move(e));
                                                        }));
  return std::unique_ptr<DisaggProxy>(new DisaggProxy(std::move(impl)));
}

DisaggProxy::DisaggProxy(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

DisaggProxy::~DisaggProxy() { stop(); }

uint16_t DisaggProxy::port() const { return impl_->http->port(); }

void DisaggProxy::stop() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping && s.active == 0 && !s.http) return;
    s.stopping = true;
  }
  if (s.http) s.http->stop(std::chrono::milliseconds(2000));  // the exchanges' on-close abort their instances
  std::unique_lock<std::mutex> lock(s.mu);
  s.idle.wait(lock, [&] { return s.active == 0; });
  lock.unlock();
  s.http.reset();
}

}  // namespace pagoda::server
