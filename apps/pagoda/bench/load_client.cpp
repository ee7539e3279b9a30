#include "apps/pagoda/bench/load_client.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

namespace pagoda::app::bench {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;
using Clock = std::chrono::steady_clock;

Result<Target> parse_base_url(const std::string& url) {
  std::string rest = url;
  const std::string scheme = "http://";
  if (rest.rfind(scheme, 0) == 0) {
    rest = rest.substr(scheme.size());
  } else if (rest.find("://") != std::string::npos) {
    return invalid_argument("--base-url must be http://HOST:PORT (no TLS), got '" + url + "'");
  }
  rest = rest.substr(0, rest.find('/'));
  Target t;
  const size_t colon = rest.rfind(':');
  t.host = colon == std::string::npos ? rest : rest.substr(0, colon);
  if (colon != std::string::npos) {
    char* end = nullptr;
    const long port = std::strtol(rest.c_str() + colon + 1, &end, 10);
    if (*end != '\0' || port < 1 || port > 65535) return invalid_argument("bad port in --base-url '" + url + "'");
    t.port = static_cast<uint16_t>(port);
  } else {
    t.port = 80;
  }
  if (t.host.empty()) return invalid_argument("no host in --base-url '" + url + "'");
  return t;
}

namespace {

std::string request_text(const Target& t, const std::string& method, const std::string& path,
                         const std::string& body) {
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: " + t.host + "\r\n";
  for (const auto& [k, v] : t.headers) req += k + ": " + v + "\r\n";
  if (!body.empty()) req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "Accept: text/event-stream\r\nConnection: close\r\n\r\n" + body;
  return req;
}

// Everything one run shares; lives on the loop thread.
struct Loader {
  net::io_context ioc;
  tcp::resolver::results_type endpoints;
  const Target* target = nullptr;
  const LoadOptions* options = nullptr;
  const std::vector<std::string>* bodies = nullptr;
  const std::vector<double>* arrivals = nullptr;
  std::vector<RequestRecord> records;
  Clock::time_point t0;
  size_t next = 0;                 // the next request to become due
  std::deque<size_t> due;          // due but waiting for a concurrency slot
  int64_t in_flight = 0;
  size_t ended = 0;
  double last_end = 0;
  std::optional<net::steady_timer> timer;

  double now() const { return std::chrono::duration<double>(Clock::now() - t0).count(); }
  void schedule();
  void start(size_t i);
  void ended_one(size_t i);
};

// One streamed request: connect, send, then decode the chunked SSE body as it comes.
class Stream : public std::enable_shared_from_this<Stream> {
 public:
  Stream(Loader& l, size_t i) : l_(l), i_(i), socket_(l.ioc), deadline_(l.ioc) {}

  void start() {
    RequestRecord& r = l_.records[i_];
    r.start = l_.now();
    out_ = request_text(*l_.target, "POST", l_.target->path, (*l_.bodies)[i_]);
    deadline_.expires_after(std::chrono::milliseconds(static_cast<int64_t>(l_.options->request_timeout_s * 1000)));
    deadline_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec) self->fail("timed out");
    });
    net::async_connect(socket_, l_.endpoints, [self = shared_from_this()](beast::error_code ec, const tcp::endpoint&) {
      if (ec) return self->fail("connect: " + ec.message());
      net::async_write(self->socket_, net::buffer(self->out_), [self](beast::error_code wec, size_t) {
        if (wec) return self->fail("write: " + wec.message());
        self->read();
      });
    });
  }

 private:
  void read() {
    socket_.async_read_some(net::buffer(buf_), [self = shared_from_this()](beast::error_code ec, size_t n) {
      if (self->finished_) return;
      if (n > 0) {
        self->raw_.append(self->buf_.data(), n);
        self->parse();
        if (self->finished_) return;
      }
      if (ec) return self->end_of_stream();
      self->read();
    });
  }

  void parse() {
    if (status_ == 0) {
      const size_t end = raw_.find("\r\n\r\n");
      if (end == std::string::npos) return;
      const std::string head = raw_.substr(0, end);
      raw_.erase(0, end + 4);
      if (std::sscanf(head.c_str(), "HTTP/1.%*d %d", &status_) != 1) return fail("bad response");
      std::string lower = head;
      for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      chunked_ = lower.find("transfer-encoding: chunked") != std::string::npos;
    }
    if (chunked_) {
      for (;;) {
        const size_t eol = raw_.find("\r\n");
        if (eol == std::string::npos) return;
        const size_t size = std::strtoul(raw_.substr(0, eol).c_str(), nullptr, 16);
        if (size == 0) {
          events();
          return end_of_stream();
        }
        if (raw_.size() < eol + 2 + size + 2) return;
        body_.append(raw_, eol + 2, size);
        raw_.erase(0, eol + 2 + size + 2);
        events();
        if (finished_) return;
      }
    }
    body_ += raw_;
    raw_.clear();
    events();
  }

  // Handles every complete "data: ..." event in body_.
  void events() {
    size_t end;
    while (!finished_ && (end = body_.find("\n\n")) != std::string::npos) {
      std::string event = body_.substr(0, end);
      body_.erase(0, end + 2);
      if (event.rfind("data: ", 0) != 0) continue;
      event.erase(0, 6);
      if (event == "[DONE]") {
        done_ = true;
        continue;
      }
      const nlohmann::json j = nlohmann::json::parse(event, nullptr, false);
      if (j.is_discarded()) continue;
      if (j.contains("error")) {
        error_ = j["error"].value("message", std::string("error event"));
        continue;
      }
      if (auto u = j.find("usage"); u != j.end() && u->is_object()) {
        l_.records[i_].prompt_tokens = u->value("prompt_tokens", int64_t{0});
        l_.records[i_].output_tokens = u->value("completion_tokens", int64_t{0});
        usage_ = true;
      }
      auto c = j.find("choices");
      if (c == j.end() || !c->is_array() || c->empty()) continue;
      const nlohmann::json& choice = c->front();
      std::string text;
      if (choice.contains("text") && choice["text"].is_string()) text = choice["text"];
      if (choice.contains("delta") && choice["delta"].contains("content") && choice["delta"]["content"].is_string()) {
        text = choice["delta"]["content"];
      }
      if (!text.empty()) token(l_.now());
    }
  }

  void token(double t) {
    RequestRecord& r = l_.records[i_];
    if (r.token_times.empty()) {
      r.ttft = t - r.start;
    } else {
      r.itl.push_back(t - r.token_times.back());
    }
    r.token_times.push_back(t);
  }

  void end_of_stream() {
    if (finished_) return;
    if (status_ != 200) return fail("HTTP " + std::to_string(status_) + ": " + body_.substr(0, 200));
    if (!error_.empty()) return fail(error_);
    if (!done_) return fail("the stream ended without [DONE]");
    RequestRecord& r = l_.records[i_];
    if (!usage_) r.output_tokens = static_cast<int64_t>(r.token_times.size());
    r.success = true;
    finish();
  }

  void fail(const std::string& why) {
    if (finished_) return;
    l_.records[i_].error = why;
    finish();
  }

  void finish() {
    finished_ = true;
    RequestRecord& r = l_.records[i_];
    r.latency = l_.now() - r.start;
    beast::error_code ec;
    socket_.close(ec);
    deadline_.cancel();
    l_.ended_one(i_);
  }

  Loader& l_;
  size_t i_;
  tcp::socket socket_;
  net::steady_timer deadline_;
  std::string out_;
  std::array<char, 16384> buf_{};
  std::string raw_, body_, error_;
  int status_ = 0;
  bool chunked_ = false, done_ = false, usage_ = false, finished_ = false;
};

void Loader::start(size_t i) {
  ++in_flight;
  std::make_shared<Stream>(*this, i)->start();
}

void Loader::ended_one(size_t i) {
  ++ended;
  last_end = std::max(last_end, now());
  if (options->on_done) options->on_done(ended);
  if (due.empty()) {
    --in_flight;
    return;
  }
  // The slot passes straight to the next waiting request: in_flight keeps counting it, so an
  // arrival handled before the posted start runs cannot take the slot too (--max-concurrency).
  const size_t n = due.front();
  due.pop_front();
  net::post(ioc, [this, n] { std::make_shared<Stream>(*this, n)->start(); });
}

// Starts every request whose time has come (or queues it for a slot), then sleeps until the next.
void Loader::schedule() {
  const double t = now();
  while (next < bodies->size() && (*arrivals)[next] <= t) {
    const size_t i = next++;
    if (options->max_concurrency > 0 && in_flight >= options->max_concurrency) {
      due.push_back(i);
    } else {
      start(i);
    }
  }
  if (next >= bodies->size()) return;
  timer->expires_at(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>((*arrivals)[next])));
  timer->async_wait([this](beast::error_code ec) {
    if (!ec) schedule();
  });
}

}  // namespace

std::vector<RequestRecord> run_load(const Target& target, const std::vector<std::string>& bodies,
                                    const std::vector<double>& arrivals, const LoadOptions& options,
                                    double* duration) {
  Loader l;
  l.target = &target;
  l.options = &options;
  l.bodies = &bodies;
  l.arrivals = &arrivals;
  l.records.resize(bodies.size());
  l.timer.emplace(l.ioc);
  beast::error_code ec;
  tcp::resolver resolver(l.ioc);
  l.endpoints = resolver.resolve(target.host, std::to_string(target.port), ec);
  l.t0 = Clock::now();
  if (ec) {
    for (auto& r : l.records) r.error = "cannot resolve " + target.host + ": " + ec.message();
    if (duration) *duration = 0;
    return l.records;
  }
  l.schedule();
  l.ioc.run();
  if (duration) *duration = l.last_end;
  return std::move(l.records);
}

Result<SimpleResponse> simple_request(const Target& target, const std::string& method, const std::string& path,
                                      const std::string& body) {
  try {
    net::io_context ioc;
    tcp::resolver resolver(ioc);
    beast::tcp_stream stream(ioc);
    stream.expires_after(std::chrono::seconds(60));
    stream.connect(resolver.resolve(target.host, std::to_string(target.port)));
    http::request<http::string_body> req(method == "GET" ? http::verb::get : http::verb::post, path, 11);
    req.set(http::field::host, target.host);
    for (const auto& [k, v] : target.headers) req.set(k, v);
    if (!body.empty()) {
      req.set(http::field::content_type, "application/json");
      req.body() = body;
      req.prepare_payload();
    }
    http::write(stream, req);
    beast::flat_buffer buffer;
    http::response_parser<http::string_body> parser;
    parser.body_limit(256u << 20);
    http::read(stream, buffer, parser);
    SimpleResponse out;
    out.status = static_cast<int>(parser.get().result_int());
    out.body = std::move(parser.get().body());
    return out;
  } catch (const std::exception& e) {
    return Status(StatusCode::kIoError,
                  method + " http://" + target.host + ":" + std::to_string(target.port) + path + ": " + e.what());
  }
}

}  // namespace pagoda::app::bench
