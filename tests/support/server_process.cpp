#include "support/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace pagoda::testing {

namespace {

using Clock = std::chrono::steady_clock;

int connect_loopback(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(fd);
    return -1;
  }
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

bool send_all(int fd, const std::string& data) {
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += static_cast<size_t>(n);
  }
  return true;
}

// Reads what is available within the deadline into `buf`; false on EOF, error or timeout.
bool read_some(int fd, std::string& buf, Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return false;
  pollfd p{fd, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
  char tmp[16384];
  ssize_t n = ::recv(fd, tmp, sizeof tmp, 0);
  if (n <= 0) return false;
  buf.append(tmp, static_cast<size_t>(n));
  return true;
}

std::string request_text(const std::string& method, const std::string& target, const std::string& body,
                         const Headers& headers, bool close) {
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  bool has_type = false;
  for (const auto& [k, v] : headers) {
    req += k + ": " + v + "\r\n";
    if (strcasecmp(k.c_str(), "content-type") == 0) has_type = true;
  }
  if (!body.empty() && !has_type) req += "Content-Type: application/json\r\n";
  if (!body.empty() || method == "POST") req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  if (close) req += "Connection: close\r\n";
  req += "\r\n" + body;
  return req;
}

}  // namespace

// --- a response parser shared by the plain and the streaming client ---

StalledClient::StalledClient(uint16_t port, const std::string& target, const std::string& body) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) return;
  int small = 1;  // the kernel rounds it up to its minimum (a few KiB)
  setsockopt(fd_, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return;
  sent_ = send_all(fd_, "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body);
}

StalledClient::~StalledClient() {
  if (fd_ >= 0) ::close(fd_);
}

bool StalledClient::closed_by_server(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  char tmp[16384];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    pollfd p{fd_, POLLIN, 0};
    if (left <= 0 || ::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
    if (::recv(fd_, tmp, sizeof tmp, 0) <= 0) return true;  // EOF or reset
  }
}

struct SseClient::Impl {
  int fd = -1;
  std::string buf;       // raw bytes not yet consumed
  std::string body;      // decoded body bytes not yet handed out as events
  bool chunked = false;
  int64_t content_left = -1;  // with Content-Length
  bool body_done = false;
  std::map<std::string, std::string> headers;

  ~Impl() {
    if (fd >= 0) ::close(fd);
  }

  // Reads the status line and headers. Returns the status, 0 on failure.
  int read_head(Clock::time_point deadline) {
    size_t end;
    while ((end = buf.find("\r\n\r\n")) == std::string::npos) {
      if (!read_some(fd, buf, deadline)) return 0;
    }
    std::string head = buf.substr(0, end);
    buf.erase(0, end + 4);
    int status = 0;
    if (std::sscanf(head.c_str(), "HTTP/1.%*d %d", &status) != 1) return 0;
    size_t pos = head.find("\r\n");
    while (pos != std::string::npos) {
      size_t next = head.find("\r\n", pos + 2);
      std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        std::transform(name.begin(), name.end(), name.begin(), ::tolower);
        std::string value = line.substr(colon + 1);
        value.erase(0, value.find_first_not_of(' '));
        headers[name] = value;
      }
      pos = next;
    }
    if (headers.count("transfer-encoding") && headers["transfer-encoding"] == "chunked") {
      chunked = true;
    } else if (headers.count("content-length")) {
      content_left = std::stoll(headers["content-length"]);
    }
    return status;
  }

  // Decodes more of the body into `body`; false when nothing more can come.
  bool pump(Clock::time_point deadline) {
    if (body_done) return false;
    if (!chunked) {
      if (content_left >= 0) {
        size_t take = std::min<size_t>(buf.size(), static_cast<size_t>(content_left));
        body += buf.substr(0, take);
        buf.erase(0, take);
        content_left -= static_cast<int64_t>(take);
        if (content_left == 0) {
          body_done = true;
          return true;
        }
      } else {
        body += buf;
        buf.clear();
      }
      if (!read_some(fd, buf, deadline)) {
        body_done = true;
        body += buf;
        buf.clear();
        return false;
      }
      return true;
    }
    for (;;) {
      size_t eol = buf.find("\r\n");
      if (eol != std::string::npos) {
        const size_t size = std::strtoul(buf.substr(0, eol).c_str(), nullptr, 16);
        if (size == 0) {
          body_done = true;
          return true;
        }
        if (buf.size() >= eol + 2 + size + 2) {
          body += buf.substr(eol + 2, size);
          buf.erase(0, eol + 2 + size + 2);
          return true;
        }
      }
      if (!read_some(fd, buf, deadline)) {
        body_done = true;
        return false;
      }
    }
  }
};

HttpResult http_request(uint16_t port, const std::string& method, const std::string& target, const std::string& body,
                        const Headers& headers, std::chrono::milliseconds timeout) {
  HttpResult out;
  SseClient::Impl c;
  c.fd = connect_loopback(port);
  if (c.fd < 0) return out;
  const auto deadline = Clock::now() + timeout;
  if (!send_all(c.fd, request_text(method, target, body, headers, true))) return out;
  out.status = c.read_head(deadline);
  if (out.status == 0) return out;
  while (c.pump(deadline)) {
  }
  out.headers = c.headers;
  out.body = std::move(c.body);
  return out;
}

std::string raw_exchange(uint16_t port, const std::string& bytes, std::chrono::milliseconds timeout) {
  int fd = connect_loopback(port);
  if (fd < 0) return "";
  send_all(fd, bytes);
  std::string out;
  const auto deadline = Clock::now() + timeout;
  while (read_some(fd, out, deadline)) {
  }
  ::close(fd);
  return out;
}

SseClient::SseClient(uint16_t port, const std::string& target, const std::string& body, const Headers& headers)
    : impl_(std::make_unique<Impl>()) {
  impl_->fd = connect_loopback(port);
  if (impl_->fd < 0) return;
  if (!send_all(impl_->fd, request_text("POST", target, body, headers, true))) return;
  status_ = impl_->read_head(Clock::now() + std::chrono::seconds(60));
}

SseClient::~SseClient() = default;

std::optional<std::string> SseClient::next(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (;;) {
    size_t end = impl_->body.find("\n\n");
    if (end != std::string::npos) {
      std::string event = impl_->body.substr(0, end);
      impl_->body.erase(0, end + 2);
      if (event.rfind("data: ", 0) == 0) event.erase(0, 6);
      return event;
    }
    if (impl_->fd < 0 || !impl_->pump(deadline)) {
      if (impl_->body.find("\n\n") == std::string::npos) return std::nullopt;
    }
  }
}

std::vector<std::string> SseClient::rest() {
  std::vector<std::string> out;
  while (auto e = next()) out.push_back(std::move(*e));
  return out;
}

void SseClient::close() {
  if (impl_->fd >= 0) ::close(impl_->fd);
  impl_->fd = -1;
}

// --- the server process ---

ServerProcess::ServerProcess(const std::string& binary, const std::vector<std::string>& args,
                             std::chrono::seconds timeout, const std::vector<std::pair<std::string, std::string>>& env,
                             const std::string& marker, const std::string& subcommand) {
  int pipefd[2];
  if (::pipe(pipefd) != 0) {
    ADD_FAILURE() << "pipe failed";
    return;
  }
  std::vector<std::string> argv_s = {binary, subcommand};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  argv_s.push_back("--port");
  argv_s.push_back("0");
  pid_ = ::fork();
  if (pid_ == 0) {
    ::dup2(pipefd[1], 2);
    ::close(pipefd[0]);
    ::close(pipefd[1]);
    for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
    std::vector<char*> argv;
    for (auto& s : argv_s) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    _exit(127);
  }
  ::close(pipefd[1]);
  err_fd_ = pipefd[0];
  reader_ = std::thread([this] {
    char buf[4096];
    for (;;) {
      ssize_t n = ::read(err_fd_, buf, sizeof buf);
      if (n <= 0) break;
      std::lock_guard<std::mutex> lock(mu_);
      log_.append(buf, static_cast<size_t>(n));
    }
  });
  const auto deadline = Clock::now() + timeout;
  while (Clock::now() < deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      size_t at = log_.find(marker);
      if (at != std::string::npos) {
        port_ = static_cast<uint16_t>(std::atoi(log_.c_str() + at + marker.size()));
        return;
      }
    }
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ADD_FAILURE() << "the server did not become ready; its log:\n" << log();
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && !exit_status_) {
    ::kill(pid_, SIGKILL);
    int status;
    ::waitpid(pid_, &status, 0);
  }
  if (reader_.joinable()) reader_.join();
  if (err_fd_ >= 0) ::close(err_fd_);
}

void ServerProcess::send_signal(int sig) {
  if (pid_ > 0 && !exit_status_) ::kill(pid_, sig);
}

std::optional<int> ServerProcess::wait_exit(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!exit_status_ && pid_ > 0) {
    int status;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) {
      exit_status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      break;
    }
    if (Clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return exit_status_;
}

std::string ServerProcess::log() const {
  std::lock_guard<std::mutex> lock(mu_);
  return log_;
}

}  // namespace pagoda::testing
