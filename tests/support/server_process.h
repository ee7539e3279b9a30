// Test helpers for the HTTP server: run `pagoda serve` as a child process on a free loopback
// port, and talk to it with a small blocking HTTP/1.1 client (Boost.Beast), including streamed
// responses read event by event and raw bytes for malformed-request tests.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pagoda::testing {

class ServerProcess {
 public:
  // Starts `binary serve <args> --port 0` and waits (up to `timeout`) for the log line
  // `marker` followed by the port: by default "ready: http://127.0.0.1:" (the model is loaded);
  // "listening on http://127.0.0.1:" returns while it still loads. Fails the calling test
  // (ADD_FAILURE) and leaves port() == 0 when it does not come up. The timeout only bounds a
  // failure: under TSan, two servers loading llama-110m's dummy weights side by side on a busy
  // 2-core machine took over 60 s (one alone: 32 s).
  // `subcommand`: "proxy" runs `binary proxy <args> --port 0` (marker "listening on ...").
  ServerProcess(const std::string& binary, const std::vector<std::string>& args,
                std::chrono::seconds timeout = std::chrono::seconds(180),
                const std::vector<std::pair<std::string, std::string>>& env = {},
                const std::string& marker = "ready: http://127.0.0.1:", const std::string& subcommand = "serve");
  ~ServerProcess();  // SIGKILL if still running

  uint16_t port() const { return port_; }
  int pid() const { return pid_; }
  void send_signal(int sig);
  // The exit status (as from WEXITSTATUS, or 128 + signal), or nullopt if still running at the end.
  std::optional<int> wait_exit(std::chrono::milliseconds timeout);
  std::string log() const;  // everything it wrote to stderr so far

 private:
  int pid_ = -1;
  int err_fd_ = -1;
  uint16_t port_ = 0;
  std::optional<int> exit_status_;
  mutable std::mutex mu_;
  std::string log_;
  std::thread reader_;
};

struct HttpResult {
  int status = 0;  // 0: no response (connection failed or closed)
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

using Headers = std::vector<std::pair<std::string, std::string>>;

HttpResult http_request(uint16_t port, const std::string& method, const std::string& target,
                        const std::string& body = "", const Headers& headers = {},
                        std::chrono::milliseconds timeout = std::chrono::seconds(60));

// Sends `bytes` as they are, then reads until the server closes or `timeout` passes; returns
// what came back.
std::string raw_exchange(uint16_t port, const std::string& bytes,
                         std::chrono::milliseconds timeout = std::chrono::seconds(10));

// A client that sends one request and then never reads (checklist R4): its receive buffer is
// made as small as the kernel allows before it connects, so the server's writes back up at once.
// Closes the connection when destroyed.
class StalledClient {
 public:
  StalledClient(uint16_t port, const std::string& target, const std::string& body);
  ~StalledClient();
  bool sent() const { return sent_; }  // the request went out whole
  // Reads (and discards) what the server sent, up to `timeout`: true when that ends in the
  // server closing (or resetting) the connection.
  bool closed_by_server(std::chrono::milliseconds timeout);

 private:
  int fd_ = -1;
  bool sent_ = false;
};

// A streamed (SSE) response read one event at a time.
class SseClient {
 public:
  SseClient(uint16_t port, const std::string& target, const std::string& body, const Headers& headers = {});
  ~SseClient();
  int status() const { return status_; }
  // The next event's data ("..." of "data: ..."), or nullopt at the end of the stream.
  std::optional<std::string> next(std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Every remaining event.
  std::vector<std::string> rest();
  void close();  // drop the connection (a client that goes away)

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  int status_ = 0;
};

}  // namespace pagoda::testing
