// DisaggProxy against hand-written instances (one HTTP exchange each, on raw sockets): what it
// sends them, that a streamed answer passes through event by event (not held back until the end),
// that a dead or failing prefill instance is retried elsewhere, that a 4xx is not, and that a
// client who leaves closes the decode instance's connection.
#include "server/disagg_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "support/server_process.h"

namespace pagoda {
namespace {

using json = nlohmann::json;
using namespace std::chrono_literals;

// A listening socket whose connections `serve` answers, one after another, on a thread.
class FakeInstance {
 public:
  explicit FakeInstance(std::function<void(int fd, const std::string& request)> serve) : serve_(std::move(serve)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 8);
    thread_ = std::thread([this] {
      while (true) {
        const int c = ::accept(fd_, nullptr, nullptr);
        if (c < 0) return;
        std::string req = read_request(c);
        {
          std::lock_guard<std::mutex> lock(mu_);
          requests_.push_back(req);
        }
        serve_(c, req);
        ::close(c);
      }
    });
  }
  ~FakeInstance() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<std::string> requests() {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  // The JSON body of request i.
  json body(size_t i) {
    const std::string r = requests().at(i);
    return json::parse(r.substr(r.find("\r\n\r\n") + 4));
  }

  // Reads one request with a Content-Length body.
  static std::string read_request(int fd) {
    std::string r;
    char b[4096];
    size_t need = std::string::npos;
    while (r.size() < need) {
      const ssize_t n = ::recv(fd, b, sizeof b, 0);
      if (n <= 0) break;
      r.append(b, static_cast<size_t>(n));
      const size_t end = r.find("\r\n\r\n");
      if (end != std::string::npos && need == std::string::npos) {
        size_t len = 0;
        const size_t at = r.find("Content-Length: ");
        if (at == std::string::npos) {
          const size_t at2 = r.find("content-length: ");
          if (at2 != std::string::npos) len = std::stoul(r.substr(at2 + 16));
        } else {
          len = std::stoul(r.substr(at + 16));
        }
        need = end + 4 + len;
      }
    }
    return r;
  }

 private:
  std::function<void(int, const std::string&)> serve_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<std::string> requests_;
};

void send_text(int fd, const std::string& s) { ::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }

void respond(int fd, int status, const std::string& body) {
  send_text(fd, "HTTP/1.1 " + std::to_string(status) + " X\r\nContent-Type: application/json\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
}

const json kKv = {{"do_remote_prefill", true}, {"remote_host", "127.0.0.1"}, {"remote_port", 1},
                  {"remote_engine_id", "e"}, {"remote_request_id", "7"}, {"remote_num_tokens", 3}};

std::function<void(int, const std::string&)> good_prefill() {
  return [](int fd, const std::string&) {
    respond(fd, 200, json{{"choices", json::array()}, {"kv_transfer_params", kKv}}.dump());
  };
}

std::unique_ptr<server::DisaggProxy> proxy(const std::vector<std::string>& prefill, const std::vector<std::string>& decode) {
  server::ProxyConfig c;
  c.host = "127.0.0.1";
  c.port = 0;
  c.prefill_urls = prefill;
  c.decode_urls = decode;
  c.connect_timeout = 1000ms;
  c.io_timeout = 10000ms;
  auto p = server::DisaggProxy::start(c);
  EXPECT_TRUE(p.ok()) << p.status().message();
  return p.ok() ? std::move(*p) : nullptr;
}

// The decode instance sends one event, then waits until the client has seen it before sending
// the rest: a proxy that held the stream back would never deliver it.
TEST(DisaggProxy, StreamsEventByEventAndSendsWhatEachInstanceNeeds) {
  std::mutex mu;
  std::condition_variable cv;
  bool first_seen = false;
  FakeInstance prefill(good_prefill());
  FakeInstance decode([&](int fd, const std::string&) {
    send_text(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    auto chunk = [&](const std::string& s) {
      char size[16];
      std::snprintf(size, sizeof size, "%zx\r\n", s.size());
      send_text(fd, size + s + "\r\n");
    };
    chunk("data: {\"n\": 1}\n\n");
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, 5s, [&] { return first_seen; });
    }
    chunk("data: {\"n\": 2}\n\n");
    chunk("data: [DONE]\n\n");
    send_text(fd, "0\r\n\r\n");
  });
  auto p = proxy({prefill.url()}, {decode.url()});
  ASSERT_NE(p, nullptr);
  const json request = {{"prompt", "hi"}, {"max_tokens", 5}, {"stream", true}, {"stream_options", {{"include_usage", true}}}};
  testing::SseClient sse(p->port(), "/v1/completions", request.dump(), {{"content-type", "application/json"}});
  EXPECT_EQ(sse.status(), 200);
  auto first = sse.next(3s);
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(*first, "{\"n\": 1}");
  {
    std::lock_guard<std::mutex> lock(mu);
    first_seen = true;
  }
  cv.notify_all();
  EXPECT_EQ(sse.next(5s), std::optional<std::string>("{\"n\": 2}"));
  EXPECT_EQ(sse.next(5s), std::optional<std::string>("[DONE]"));
  // The prefill instance got the request with do_remote_decode, not streamed; the decode
  // instance got it as sent, with the prefill instance's parameters.
  const json pre = prefill.body(0);
  EXPECT_EQ(pre["kv_transfer_params"], json({{"do_remote_decode", true}}));
  EXPECT_EQ(pre["stream"], false);
  EXPECT_FALSE(pre.contains("stream_options"));
  EXPECT_EQ(pre["max_tokens"], 5);
  const json dec = decode.body(0);
  EXPECT_EQ(dec["kv_transfer_params"], kKv);
  EXPECT_EQ(dec["stream"], true);
  EXPECT_EQ(dec["stream_options"], request["stream_options"]);
}

// A prefill instance that is not there, or answers 503, is passed over; a 400 comes back as it is.
TEST(DisaggProxy, RetriesAFailedPrefillElsewhereButNotABadRequest) {
  FakeInstance failing([](int fd, const std::string&) { respond(fd, 503, "{}"); });
  FakeInstance bad([](int fd, const std::string&) { respond(fd, 400, R"({"error": {"message": "max_tokens"}})"); });
  FakeInstance good(good_prefill());
  FakeInstance decode([](int fd, const std::string&) { respond(fd, 200, R"({"choices": [{"text": "ok"}]})"); });
  std::string gone;
  {
    FakeInstance closed([](int, const std::string&) {});
    gone = closed.url();
  }
  auto p = proxy({gone, failing.url(), good.url()}, {decode.url()});
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < 3; ++i) {
    testing::HttpResult r = testing::http_request(p->port(), "POST", "/v1/completions", R"({"prompt": "x"})",
                                                  {{"content-type", "application/json"}});
    EXPECT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body, R"({"choices": [{"text": "ok"}]})");
  }
  EXPECT_EQ(good.requests().size(), 3u);
  EXPECT_EQ(decode.requests().size(), 3u);
  const std::string m = testing::http_request(p->port(), "GET", "/metrics").body;
  EXPECT_NE(m.find("pagoda_proxy_requests_total{outcome=\"ok\"} 3"), std::string::npos) << m;
  EXPECT_EQ(m.find("pagoda_proxy_prefill_retries_total 0"), std::string::npos) << m;

  auto q = proxy({bad.url()}, {decode.url()});
  testing::HttpResult r = testing::http_request(q->port(), "POST", "/v1/completions", R"({"prompt": "x"})",
                                                {{"content-type", "application/json"}});
  EXPECT_EQ(r.status, 400);
  EXPECT_NE(r.body.find("max_tokens"), std::string::npos);
  EXPECT_EQ(decode.requests().size(), 3u);  // never reached
  EXPECT_EQ(testing::http_request(q->port(), "POST", "/v1/completions", "not json").status, 400);
  EXPECT_EQ(testing::http_request(q->port(), "GET", "/nothing").status, 404);
}

// Nothing to prefill on: 503, and /health says so.
TEST(DisaggProxy, NoPrefillInstanceIs503) {
  std::string gone;
  {
    FakeInstance closed([](int, const std::string&) {});
    gone = closed.url();
  }
  FakeInstance decode([](int fd, const std::string&) { respond(fd, 200, "{}"); });
  auto p = proxy({gone}, {decode.url()});
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(testing::http_request(p->port(), "POST", "/v1/completions", R"({"prompt": "x"})").status, 503);
  EXPECT_EQ(testing::http_request(p->port(), "GET", "/health").status, 503);
  EXPECT_TRUE(decode.requests().empty());
}

// A client that leaves mid-stream: the proxy closes its decode connection (the decode instance
// then aborts the request).
TEST(DisaggProxy, AClientThatLeavesClosesTheDecodeConnection) {
  std::atomic<bool> decode_saw_close{false};
  FakeInstance prefill(good_prefill());
  FakeInstance decode([&](int fd, const std::string&) {
    send_text(fd, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n");
    send_text(fd, "10\r\ndata: {\"n\": 1}\n\n\r\n");
    char b[64];
    for (int i = 0; i < 100; ++i) {  // wait up to 5 s for the proxy to hang up
      timeval tv{0, 50000};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      if (::recv(fd, b, sizeof b, 0) == 0) {
        decode_saw_close = true;
        return;
      }
    }
  });
  auto p = proxy({prefill.url()}, {decode.url()});
  ASSERT_NE(p, nullptr);
  {
    testing::SseClient sse(p->port(), "/v1/completions", R"({"prompt": "x", "stream": true})",
                           {{"content-type", "application/json"}});
    ASSERT_TRUE(sse.next(3s).has_value());
    sse.close();
  }
  for (int i = 0; i < 100 && !decode_saw_close; ++i) std::this_thread::sleep_for(50ms);
  EXPECT_TRUE(decode_saw_close);
}

}  // namespace
}  // namespace pagoda
