#include "kv_transfer/remote_connector.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "base/check.h"
#include "base/log.h"
#include "base/sha256.h"
#include "model/kv_cache.h"
#include "model/tensor_parallel.h"

namespace pagoda {
namespace {

constexpr uint32_t kMagic = 0x54564b50;  // "PKVT"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxString = 4096;
constexpr uint8_t kRead = 'R';
constexpr uint8_t kDone = 'D';
// A payload larger than this is refused before anything is allocated for it.
constexpr uint64_t kMaxPayload = uint64_t{64} << 30;

using Clock = std::chrono::steady_clock;

// ---- sockets -----------------------------------------------------------------------------------

// Waits for `fd` to be ready for `events` until `deadline`.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return false;
  }
}

// Writes all n bytes; the deadline restarts with every byte that goes out (a slow reader is fine,
// one that stops reading is not).
bool send_all(int fd, const void* data, size_t n, Clock::duration timeout) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLOUT, Clock::now() + timeout)) return false;
    const ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// Reads exactly n bytes; the deadline restarts with every byte that arrives (a slow link is fine,
// a silent one is not).
bool recv_all(int fd, void* data, size_t n, Clock::duration timeout) {
  auto* p = static_cast<uint8_t*>(data);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, Clock::now() + timeout)) return false;
    const ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k <= 0) return false;
    p += k;
    n -= static_cast<size_t>(k);
  }
  return true;
}

// A small message built or read field by field.
struct Out {
  std::vector<uint8_t> b;
  template <class T>
  void put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof v);
  }
  void put_string(const std::string& s) {
    put<uint32_t>(static_cast<uint32_t>(std::min<size_t>(s.size(), kMaxString)));
    b.insert(b.end(), s.begin(), s.begin() + static_cast<ptrdiff_t>(std::min<size_t>(s.size(), kMaxString)));
  }
};

template <class T>
bool get(int fd, T* v, Clock::duration timeout) {
  return recv_all(fd, v, sizeof *v, timeout);
}

bool get_string(int fd, std::string* s, Clock::duration timeout) {
  uint32_t n = 0;
  if (!get(fd, &n, timeout) || n > kMaxString) return false;
  s->resize(n);
  return n == 0 || recv_all(fd, s->data(), n, timeout);
}

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

Result<int> connect_to(const std::string& host, int port, Clock::duration timeout) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string where = host + ":" + std::to_string(port);
  if (int e = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found); e != 0) {
    return unavailable("KV transfer: cannot resolve " + where + ": " + gai_strerror(e));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (::connect(fd, a->ai_addr, a->ai_addrlen) == 0 ||
        (errno == EINPROGRESS && wait_fd(fd, POLLOUT, Clock::now() + timeout))) {
      int err = 0;
      socklen_t len = sizeof err;
      ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err == 0) {
        const int one = 1;
        ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        ::freeaddrinfo(found);
        return fd;
      }
      why = std::strerror(err);
    } else {
      why = errno == EINPROGRESS ? "timed out" : std::strerror(errno);
    }
    ::close(fd);
  }
  ::freeaddrinfo(found);
  return unavailable("KV transfer: cannot connect to " + where + ": " + why);
}

std::string shm_name(const std::string& engine, int rank, uint64_t id, uint64_t n) {
  std::string clean;
  for (char c : engine) clean += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
  return "/pagoda-kv-" + clean.substr(0, 64) + "-" + std::to_string(::getpid()) + "-r" + std::to_string(rank) + "-" +
         std::to_string(id) + "-" + std::to_string(n);
}

}  // namespace

std::array<uint8_t, 32> prompt_hash(std::string_view cache_salt, std::span<const TokenId> tokens) {
  Sha256 h;
  h.update(std::string_view("pagoda kv prompt v1"));
  const uint64_t salt_len = cache_salt.size();
  h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&salt_len), sizeof salt_len));
  h.update(cache_salt);
  h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(tokens.data()), tokens.size_bytes()));
  return h.finish();
}

std::array<uint8_t, 32> transfer_fingerprint(const std::array<uint8_t, 32>& weights, KvCacheDtype dtype,
                                             int64_t block_size, int64_t num_layers, int64_t num_kv_heads,
                                             int64_t head_dim) {
  Sha256 h;
  h.update(std::string_view("pagoda kv transfer v1"));
  h.update(std::span<const uint8_t>(weights));
  const int64_t layout[] = {static_cast<int64_t>(dtype), block_size, num_layers, num_kv_heads, head_dim};
  h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(layout), sizeof layout));
  return h.finish();
}

// ---- scheduler side --------------------------------------------------------------------------

int64_t RemoteScheduler::get_num_new_matched_tokens(const KvRequest& r, int64_t num_local_computed) {
  // EngineCore::add_request kept the parameters only for a prompt the prefill instance holds whole.
  if (!consumer_ || r.kv_transfer == nullptr || !r.kv_transfer->do_remote_prefill) return 0;
  if (r.kv_transfer->remote_num_tokens != r.num_tokens()) return 0;
  if (!peers_.empty()) {
    const std::string peer = r.kv_transfer->remote_host + ":" + std::to_string(r.kv_transfer->remote_port);
    if (std::find(peers_.begin(), peers_.end(), peer) == peers_.end()) {
      if (!warned_peer_) {
        log_line(LogLevel::kWarning, "kv",
                 "kv_transfer_params name " + peer + ", which is not one of prefill_peers: the prompt is computed here "
                 "(warned once)");
        warned_peer_ = true;
      }
      return 0;
    }
  }
  return r.num_tokens() - num_local_computed;
}

void RemoteScheduler::update_state_after_alloc(const KvRequest& r, std::span<const BlockId> blocks,
                                               int64_t num_local_computed, int64_t num_external) {
  if (num_external <= 0) return;
  const KvTransferParams& p = *r.kv_transfer;
  KvRemoteRecv recv;
  recv.request_id = r.id;
  recv.host = p.remote_host;
  recv.port = p.remote_port;
  recv.tp_size = p.remote_tp_size;
  recv.transfer_id = p.remote_request_id;
  recv.prompt_hash = prompt_hash(r.cache_salt, r.tokens.first(static_cast<size_t>(p.remote_num_tokens)));
  recv.num_tokens = p.remote_num_tokens;
  recv.first_block = num_local_computed / block_size_;
  const int64_t num_blocks = (p.remote_num_tokens + block_size_ - 1) / block_size_;
  PAGODA_CHECK(static_cast<int64_t>(blocks.size()) >= num_blocks);
  recv.blocks.assign(blocks.begin() + recv.first_block, blocks.begin() + num_blocks);
  next_.recvs.push_back(std::move(recv));
  awaiting_.push_back(r.id);
  loading_[r.id] = num_external;
  stats_.remote_queries += num_external;
}

void RemoteScheduler::on_scheduled(const KvRequest& r, int64_t num_computed_after, std::span<const BlockId> blocks) {
  if (!producer_ || r.kv_transfer == nullptr || !r.kv_transfer->do_remote_decode) return;
  // The step that reaches the prompt's last token computes the last of its KV: keep them after it.
  if (num_computed_after < r.num_tokens() || sent_.count(r.id)) return;
  sent_.insert(r.id);
  KvRemoteSend send;
  send.transfer_id = r.kv_transfer->transfer_id;
  send.num_tokens = r.num_tokens();
  send.prompt_hash = prompt_hash(r.cache_salt, r.tokens);
  const int64_t num_blocks = (send.num_tokens + block_size_ - 1) / block_size_;
  PAGODA_CHECK(static_cast<int64_t>(blocks.size()) >= num_blocks);
  send.blocks.assign(blocks.begin(), blocks.begin() + num_blocks);
  next_.sends.push_back(std::move(send));
}

KvConnectorMetadata RemoteScheduler::build_meta() {
  KvConnectorMetadata meta = std::move(next_);
  next_ = KvConnectorMetadata{};
  meta.awaiting = awaiting_;
  return meta;
}

void RemoteScheduler::update_connector_output(const KvConnectorMetadata& meta, const KvConnectorOutput& output,
                                              std::vector<RequestId>& done, std::vector<RequestId>& failed) {
  stats_.moved += output.counters;
  const bool matches = output.load_states.size() == meta.awaiting.size();
  for (size_t i = 0; i < meta.awaiting.size(); ++i) {
    const RequestId id = meta.awaiting[i];
    auto it = loading_.find(id);
    if (it == loading_.end()) continue;
    const KvLoadState state = matches ? output.load_states[i] : KvLoadState::kFailed;
    if (state == KvLoadState::kPending) continue;
    if (state == KvLoadState::kDone) {
      stats_.remote_hits += it->second;
      done.push_back(id);
    } else {
      ++stats_.failed_loads;
      failed.push_back(id);
    }
    loading_.erase(it);
    awaiting_.erase(std::remove(awaiting_.begin(), awaiting_.end(), id), awaiting_.end());
  }
}

void RemoteScheduler::request_finished(const KvRequest& r) {
  loading_.erase(r.id);
  sent_.erase(r.id);
  awaiting_.erase(std::remove(awaiting_.begin(), awaiting_.end(), r.id), awaiting_.end());
}

KvConnectorStats RemoteScheduler::stats() const {
  KvConnectorStats s = stats_;
  s.requests_waiting = static_cast<int64_t>(awaiting_.size());
  return s;
}

// ---- worker side: serving ----------------------------------------------------------------------

RemoteWorker::RemoteWorker(KvConnectorWorkerConfig config, KvBlockLayout shard, int64_t total_heads, int rank,
                           RemoteTimeouts timeouts)
    : config_(std::move(config)),
      shard_(shard),
      total_heads_(total_heads),
      rank_(rank),
      timeouts_(timeouts),
      shm_(config_.connector == "ShmConnector") {}

RemoteWorker::~RemoteWorker() {
  stopping_ = true;
  if (listen_fd_ >= 0) ::shutdown(listen_fd_, SHUT_RDWR);
  if (server_.joinable()) server_.join();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& c : connections_) {
      if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
    }
    staged_cv_.notify_all();
  }
  for (auto& c : connections_) c->thread.join();
  for (auto& [id, f] : fetches_) f->cancel();
  for (auto& f : abandoned_) f->cancel();
  for (auto& [id, f] : fetches_) f->thread.join();
  for (auto& f : abandoned_) f->thread.join();
}

Status RemoteWorker::register_kv_caches(const KvCacheTensors& kv, const Kernels& kernels) {
  kv_ = &kv;
  kernels_ = &kernels;
  if (kv.block_bytes() != shard_.block_bytes()) {
    return internal_error("KV transfer: the KV cache's blocks are " + std::to_string(kv.block_bytes()) +
                          " bytes, the shard's layout says " + std::to_string(shard_.block_bytes()));
  }
  const bool producer = config_.kv_role == "kv_producer" || config_.kv_role == "kv_both";
  if (!producer) return Status::ok_status();
  const int port = config_.kv_port == 0 ? 0 : config_.kv_port + rank_;
  const std::string where = config_.kv_ip + ":" + std::to_string(port);
  if (port > 65535) {
    return invalid_argument("--kv-transfer-config: kv_port " + std::to_string(config_.kv_port) + " + rank " +
                            std::to_string(rank_) + " is past 65535");
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::inet_pton(AF_INET, config_.kv_ip.c_str(), &addr.sin_addr) != 1) {
    return invalid_argument("--kv-transfer-config: kv_ip '" + config_.kv_ip + "' is not an IPv4 address");
  }
  listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  const int one = 1;
  ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    return unavailable("KV transfer: cannot listen on " + where + " (rank " + std::to_string(rank_) +
                       " serves on kv_port + rank): " + std::strerror(errno));
  }
  socklen_t len = sizeof addr;
  ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  server_ = std::thread([this] { serve_loop(); });
  return Status::ok_status();
}

void RemoteWorker::serve_loop() {
  constexpr size_t kMaxConnections = 256;
  while (!stopping_) {
    // Wakes at least once a second: kept blocks nobody reads expire even on an idle instance.
    pollfd p{listen_fd_, POLLIN, 0};
    const int ready = ::poll(&p, 1, 1000);
    {
      std::lock_guard<std::mutex> lock(mu_);
      expire_locked(Clock::now());
      // Connections that ended are joined here, so that threads do not pile up.
      for (auto it = connections_.begin(); it != connections_.end();) {
        if (!(*it)->done) {
          ++it;
          continue;
        }
        (*it)->thread.join();
        it = connections_.erase(it);
      }
    }
    if (ready <= 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      if (stopping_) return;
      continue;
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    std::lock_guard<std::mutex> lock(mu_);
    if (connections_.size() >= kMaxConnections) {
      ::close(fd);  // the decode instance's fetch fails and it computes the prompt
      continue;
    }
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    Connection* raw = c.get();
    connections_.push_back(std::move(c));
    try {
      raw->thread = std::thread([this, raw] { serve_connection(raw); });
    } catch (const std::system_error&) {
      ::close(fd);
      connections_.pop_back();
    }
  }
}

void RemoteWorker::expire_locked(Clock::time_point now) {
  for (auto it = staged_.begin(); it != staged_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    staged_bytes_ -= static_cast<int64_t>(it->second.data->size());
    it = staged_.erase(it);
  }
  for (auto it = not_kept_.begin(); it != not_kept_.end();) it = it->second > now ? std::next(it) : not_kept_.erase(it);
}

void RemoteWorker::serve_connection(Connection* c) {
  const int fd = c->fd;
  const auto io = timeouts_.io;
  std::vector<std::string> shm_names;  // handed out here; unlinked when the connection ends
  auto refuse = [&](const std::string& why) {
    Out o;
    o.put<uint8_t>(1);
    o.put_string(why);
    o.put<int64_t>(shard_.head_begin);
    o.put<int64_t>(shard_.head_end);
    send_all(fd, o.b.data(), o.b.size(), io);
  };
  uint32_t magic = 0, version = 0;
  std::array<uint8_t, 32> fp{};
  std::string description;
  int64_t want_begin = 0, want_end = 0;
  uint8_t shm = 0;  // the client's choice: the payload through shared memory (ShmConnector) or the socket
  int32_t client_rank = 0, client_size = 1;  // which decode rank reads, of how many
  bool ok = get(fd, &magic, io) && magic == kMagic && get(fd, &version, io) && recv_all(fd, fp.data(), fp.size(), io) &&
            get_string(fd, &description, io) && get(fd, &want_begin, io) && get(fd, &want_end, io) &&
            get(fd, &shm, io) && shm <= 1 && get(fd, &client_rank, io) && get(fd, &client_size, io) &&
            client_size >= 1 && client_size <= 64 && client_rank >= 0 && client_rank < client_size;
  if (!ok) {
    refuse("not a KV transfer handshake (or a version other than " + std::to_string(kVersion) + ")");
  } else if (version != kVersion) {
    refuse("KV transfer version " + std::to_string(version) + ", this instance speaks " + std::to_string(kVersion));
    ok = false;
  } else if (fp != config_.transfer_fingerprint) {
    const std::string why = "KV layout mismatch: this prefill instance holds " + config_.transfer_description +
                            ", the decode instance " + description;
    log_line(LogLevel::kError, "kv", "refused a KV transfer: " + why);
    refuse(why);
    ok = false;
  } else {
    Out o;
    o.put<uint8_t>(0);
    o.put_string("");
    o.put<int64_t>(shard_.head_begin);
    o.put<int64_t>(shard_.head_end);
    ok = send_all(fd, o.b.data(), o.b.size(), io);
  }
  while (ok && !stopping_) {
    uint8_t op = 0;
    uint64_t id = 0;
    std::array<uint8_t, 32> hash{};
    int64_t begin = 0, end = 0;
    // Between requests a client may take its time; a half-sent request may not.
    if (!wait_fd(fd, POLLIN, Clock::now() + timeouts_.expiry)) break;
    if (!get(fd, &op, io) || !get(fd, &id, io) || !recv_all(fd, hash.data(), hash.size(), io) || !get(fd, &begin, io) ||
        !get(fd, &end, io)) {
      break;
    }
    if ((op != kRead && op != kDone) || begin < shard_.head_begin || end > shard_.head_end || begin >= end) break;
    // Wait a little for the blocks: the step that keeps them may still be running here when
    // another rank's answer already reached the decode instance.
    std::shared_ptr<const std::vector<uint8_t>> data;
    int64_t num_tokens = 0, num_blocks = 0;
    {
      std::unique_lock<std::mutex> lock(mu_);
      staged_cv_.wait_for(lock, timeouts_.staged,
                          [&] { return stopping_ || staged_.count(id) > 0 || not_kept_.count(id) > 0; });
      auto it = staged_.find(id);
      // Only a reader of the very prompt that was kept gets it.
      if (it != staged_.end() && it->second.prompt_hash == hash) {
        Staged& st = it->second;
        if (op == kDone) {
          // Freed once every head has been read by every decode rank that holds it (several,
          // when that instance has more ranks than KV heads).
          const int readers = client_size > total_heads_ ? static_cast<int>(client_size / total_heads_) : 1;
          for (int64_t h = begin; h < end; ++h) st.read_by[static_cast<size_t>(h - shard_.head_begin)] |= uint64_t{1} << client_rank;
          if (std::all_of(st.read_by.begin(), st.read_by.end(), [&](uint64_t m) { return std::popcount(m) >= readers; })) {
            staged_bytes_ -= static_cast<int64_t>(st.data->size());
            staged_.erase(it);
          }
        } else {
          data = st.data;
          num_tokens = st.num_tokens;
          num_blocks = st.num_blocks;
        }
      }
    }
    if (op == kDone) continue;
    // The heads asked for, cut out of the kept blocks without holding the lock.
    const KvBlockLayout wire = shard_.with_heads(begin, end);
    std::vector<uint8_t> payload;
    try {
      if (data) {
        payload.resize(static_cast<size_t>(num_blocks * wire.block_bytes()));
        for (int64_t b = 0; b < num_blocks; ++b) {
          copy_block_heads(shard_, data->data() + b * shard_.block_bytes(), wire, payload.data() + b * wire.block_bytes(),
                           begin, end);
        }
      }
    } catch (const std::bad_alloc&) {
      log_line(LogLevel::kWarning, "kv", "KV transfer: no memory to serve transfer " + std::to_string(id));
      data.reset();
      payload.clear();
      num_blocks = 0;
    }
    data.reset();
    Out o;
    o.put<uint8_t>(num_blocks > 0 ? 0 : 1);
    o.put<int64_t>(num_tokens);
    o.put<int64_t>(num_blocks);
    o.put<uint64_t>(payload.size());
    o.put<uint64_t>(XXH3_64bits(payload.data(), payload.size()));
    if (num_blocks > 0 && shm == 1) {
      // The payload goes through a shared memory object the client maps and reads; it is unlinked
      // when the client has it, or at the latest when this connection ends.
      static std::atomic<uint64_t> counter{0};
      const std::string name = shm_name(config_.engine_id, rank_, id, counter++);
      const int m = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
      bool written = m >= 0 && ::ftruncate(m, static_cast<off_t>(payload.size())) == 0;
      if (m >= 0) shm_names.push_back(name);
      if (written) {
        void* p = ::mmap(nullptr, payload.size(), PROT_WRITE, MAP_SHARED, m, 0);
        written = p != MAP_FAILED;
        if (written) {
          std::memcpy(p, payload.data(), payload.size());
          ::munmap(p, payload.size());
        }
      }
      if (m >= 0) ::close(m);
      if (!written) break;  // the client sees the connection drop and fails the load
      o.put_string(name);
      if (!send_all(fd, o.b.data(), o.b.size(), io)) break;
    } else if (!send_all(fd, o.b.data(), o.b.size(), io) || !send_all(fd, payload.data(), payload.size(), io)) {
      break;
    }
    std::lock_guard<std::mutex> lock(mu_);
    served_blocks_ += num_blocks;
    served_bytes_ += static_cast<int64_t>(payload.size());
  }
  for (const std::string& name : shm_names) ::shm_unlink(name.c_str());  // ENOENT when the client has it
  std::lock_guard<std::mutex> lock(mu_);
  ::close(fd);
  c->fd = -1;
  c->done = true;
}

size_t RemoteWorker::num_staged() const {
  std::lock_guard<std::mutex> lock(mu_);
  return staged_.size();
}

int64_t RemoteWorker::staged_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return staged_bytes_;
}

// ---- worker side: fetching ---------------------------------------------------------------------

void RemoteWorker::Fetch::cancel() {
  cancelled = true;
  std::lock_guard<std::mutex> lock(fd_mu);
  if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
}

Status RemoteWorker::fetch_from(Fetch* f, int rank, int64_t begin, int64_t end, bool read_them) {
  const KvRemoteRecv& r = f->recv;
  const auto io = timeouts_.io;
  const std::string where = r.host + ":" + std::to_string(r.port + rank);
  PAGODA_ASSIGN_OR_RETURN(const int raw, connect_to(r.host, r.port + rank, io));
  Fd fd(raw);
  // Registered for cancel(), which shuts it down so that a blocked read returns at once.
  struct Registered {
    Fetch* f;
    Registered(Fetch* fetch, int socket) : f(fetch) {
      std::lock_guard<std::mutex> lock(f->fd_mu);
      f->fd = socket;
      if (f->cancelled) ::shutdown(socket, SHUT_RDWR);
    }
    ~Registered() {
      std::lock_guard<std::mutex> lock(f->fd_mu);
      f->fd = -1;
    }
  } registered(f, raw);
  const auto lost = [&](const std::string& what) { return unavailable("KV transfer from " + where + ": " + what); };
  Out hello;
  hello.put<uint32_t>(kMagic);
  hello.put<uint32_t>(kVersion);
  hello.b.insert(hello.b.end(), config_.transfer_fingerprint.begin(), config_.transfer_fingerprint.end());
  hello.put_string(config_.transfer_description);
  hello.put<int64_t>(begin);
  hello.put<int64_t>(end);
  hello.put<uint8_t>(shm_ ? 1 : 0);
  hello.put<int32_t>(rank_);
  hello.put<int32_t>(config_.tp_size);
  if (!send_all(fd.fd, hello.b.data(), hello.b.size(), io)) return lost("the handshake could not be sent");
  uint8_t status = 0;
  std::string message;
  int64_t server_begin = 0, server_end = 0;
  if (!get(fd.fd, &status, io) || !get_string(fd.fd, &message, io) || !get(fd.fd, &server_begin, io) ||
      !get(fd.fd, &server_end, io)) {
    return lost("no answer to the handshake");
  }
  if (status != 0) {
    log_line(LogLevel::kError, "kv", "KV transfer from " + where + " refused: " + message);
    return unavailable("KV transfer from " + where + " refused: " + message);
  }
  if (begin < server_begin || end > server_end) {
    return lost("it holds KV heads [" + std::to_string(server_begin) + ", " + std::to_string(server_end) +
                "), not [" + std::to_string(begin) + ", " + std::to_string(end) + ")");
  }
  if (!read_them) {
    Out done;
    done.put<uint8_t>(kDone);
    done.put<uint64_t>(r.transfer_id);
    done.b.insert(done.b.end(), r.prompt_hash.begin(), r.prompt_hash.end());
    done.put<int64_t>(begin);
    done.put<int64_t>(end);
    if (!send_all(fd.fd, done.b.data(), done.b.size(), io)) return lost("the release could not be sent");
    return Status::ok_status();
  }
  Out read;
  read.put<uint8_t>(kRead);
  read.put<uint64_t>(r.transfer_id);
  read.b.insert(read.b.end(), r.prompt_hash.begin(), r.prompt_hash.end());
  read.put<int64_t>(begin);
  read.put<int64_t>(end);
  if (!send_all(fd.fd, read.b.data(), read.b.size(), io)) return lost("the read could not be sent");
  int64_t num_tokens = 0, num_blocks = 0;
  uint64_t bytes = 0, checksum = 0;
  if (!get(fd.fd, &status, io) || !get(fd.fd, &num_tokens, io) || !get(fd.fd, &num_blocks, io) ||
      !get(fd.fd, &bytes, io) || !get(fd.fd, &checksum, io)) {
    return lost("no answer to the read");
  }
  if (status != 0) return lost("request " + std::to_string(r.transfer_id) + " is unknown there, or expired");
  const KvBlockLayout wire = shard_.with_heads(begin, end);
  const int64_t want_blocks = r.first_block + static_cast<int64_t>(r.blocks.size());
  if (num_tokens != r.num_tokens || num_blocks != want_blocks ||
      bytes != static_cast<uint64_t>(num_blocks * wire.block_bytes()) || bytes > kMaxPayload) {
    return lost("it sent " + std::to_string(num_tokens) + " tokens in " + std::to_string(num_blocks) + " blocks of " +
                std::to_string(bytes) + " bytes; " + std::to_string(r.num_tokens) + " tokens were expected");
  }
  std::vector<uint8_t> payload(bytes);
  if (shm_) {
    std::string name;
    if (!get_string(fd.fd, &name, io) || name.rfind("/pagoda-kv-", 0) != 0) return lost("no shared memory object named");
    const int m = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
    if (m < 0) return lost("cannot open shared memory " + name + ": " + std::strerror(errno));
    ::shm_unlink(name.c_str());
    Fd mfd(m);
    struct stat st {};
    if (::fstat(m, &st) != 0 || static_cast<uint64_t>(st.st_size) != bytes) return lost("shared memory " + name + " has the wrong size");
    if (bytes > 0) {
      void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, m, 0);
      if (p == MAP_FAILED) return lost("cannot map shared memory " + name);
      std::memcpy(payload.data(), p, bytes);
      ::munmap(p, bytes);
    }
  } else {
    // In pieces, so that a cancelled fetch stops within one piece.
    constexpr size_t kPiece = size_t{4} << 20;
    for (size_t at = 0; at < bytes; at += kPiece) {
      if (f->cancelled) return lost("cancelled");
      if (Clock::now() > f->deadline) return lost("the load took longer than its deadline");
      if (!recv_all(fd.fd, payload.data() + at, std::min<size_t>(kPiece, bytes - at), io)) {
        return lost("the connection dropped after " + std::to_string(at) + " of " + std::to_string(bytes) + " bytes");
      }
    }
  }
  if (XXH3_64bits(payload.data(), payload.size()) != checksum) return data_loss("KV transfer from " + where + ": the blocks arrived corrupted (checksum mismatch)");
  for (size_t i = 0; i < r.blocks.size(); ++i) {
    const int64_t b = r.first_block + static_cast<int64_t>(i);
    copy_block_heads(wire, payload.data() + b * wire.block_bytes(), shard_,
                     f->data.data() + static_cast<int64_t>(i) * shard_.block_bytes(), begin, end);
  }
  f->received_bytes += static_cast<int64_t>(bytes);
  Out done;
  done.put<uint8_t>(kDone);
  done.put<uint64_t>(r.transfer_id);
  done.b.insert(done.b.end(), r.prompt_hash.begin(), r.prompt_hash.end());
  done.put<int64_t>(begin);
  done.put<int64_t>(end);
  send_all(fd.fd, done.b.data(), done.b.size(), io);  // the server's expiry covers a lost one
  return Status::ok_status();
}

void RemoteWorker::fetch(Fetch* f) {
  const auto start = Clock::now();
  f->deadline = start + timeouts_.total;
  const KvRemoteRecv& r = f->recv;
  Status st = Status::ok_status();
  f->data.assign(r.blocks.size() * static_cast<size_t>(shard_.block_bytes()), 0);
  // Each of this rank's heads from the first prefill rank that holds it (several hold each head
  // when that instance has more ranks than KV heads); the other holders are only told they may
  // let go of it.
  int64_t next = shard_.head_begin;
  std::vector<std::tuple<int, int64_t, int64_t>> releases;
  for (int rank = 0; rank < r.tp_size; ++rank) {
    const IndexRange theirs = kv_head_range(total_heads_, rank, r.tp_size);
    const int64_t begin = std::max(shard_.head_begin, theirs.begin), end = std::min(shard_.head_end, theirs.end);
    if (begin >= end) continue;
    if (begin != next || !st.ok()) {
      releases.emplace_back(rank, begin, end);
      continue;
    }
    st = fetch_from(f, rank, begin, end, /*read=*/true);
    next = end;
  }
  for (const auto& [rank, begin, end] : releases) {
    if (!f->cancelled) (void)fetch_from(f, rank, begin, end, /*read=*/false);
  }
  if (st.ok() && next != shard_.head_end) {
    st = unavailable("KV transfer: no rank of the prefill instance holds KV head " + std::to_string(next));
  }
  if (!st.ok() && !f->cancelled) log_line(LogLevel::kWarning, "kv", st.message() + " (the request computes its prompt)");
  f->seconds = std::chrono::duration<double>(Clock::now() - start).count();
  {
    std::lock_guard<std::mutex> lock(fetch_mu_);
    f->state = static_cast<int>(st.ok() ? KvLoadState::kDone : KvLoadState::kFailed);
  }
  fetch_cv_.notify_all();
}

void RemoteWorker::start_step(const KvConnectorMetadata& meta, bool idle) {
  PAGODA_CHECK(kv_ != nullptr);
  // Fetches no longer awaited ended on every rank, or their request did: forget them (a thread
  // still running is cancelled and joined later).
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    if (std::find(meta.awaiting.begin(), meta.awaiting.end(), it->first) != meta.awaiting.end()) {
      ++it;
      continue;
    }
    it->second->cancel();
    abandoned_.push_back(std::move(it->second));
    it = fetches_.erase(it);
  }
  for (auto it = settled_.begin(); it != settled_.end();) {
    const bool awaited = std::find(meta.awaiting.begin(), meta.awaiting.end(), it->first) != meta.awaiting.end();
    it = awaited ? std::next(it) : settled_.erase(it);
  }
  for (auto it = abandoned_.begin(); it != abandoned_.end();) {
    if ((*it)->state.load() == static_cast<int>(KvLoadState::kPending)) {
      ++it;
      continue;
    }
    (*it)->thread.join();
    it = abandoned_.erase(it);
  }
  for (const KvRemoteRecv& recv : meta.recvs) {
    // A new load for a request replaces whatever was known of an earlier one.
    settled_.erase(recv.request_id);
    if (auto old = fetches_.find(recv.request_id); old != fetches_.end()) {
      old->second->cancel();
      abandoned_.push_back(std::move(old->second));
      fetches_.erase(old);
    }
    bool sane = recv.tp_size >= 1 && recv.tp_size <= 64 && recv.port > 0 && recv.port + recv.tp_size - 1 < 65536 &&
                recv.first_block >= 0 && !recv.blocks.empty();
    for (BlockId b : recv.blocks) sane = sane && b >= 0 && b < kv_->num_blocks();
    if (!sane) {
      settled_[recv.request_id] = KvLoadState::kFailed;
      continue;
    }
    auto f = std::make_unique<Fetch>();
    f->recv = recv;
    Fetch* raw = f.get();
    f->thread = std::thread([this, raw] { fetch(raw); });
    fetches_[recv.request_id] = std::move(f);
  }
  if (idle && !fetches_.empty()) {
    std::unique_lock<std::mutex> lock(fetch_mu_);
    fetch_cv_.wait_for(lock, std::chrono::milliseconds(5), [&] {
      for (const auto& [id, f] : fetches_) {
        if (f->state.load() != static_cast<int>(KvLoadState::kPending)) return true;
      }
      return false;
    });
  }
  // Arrived: into the request's blocks now, before this step's forward pass.
  for (auto it = fetches_.begin(); it != fetches_.end();) {
    Fetch& f = *it->second;
    const auto state = static_cast<KvLoadState>(f.state.load());
    if (state == KvLoadState::kPending) {
      ++it;
      continue;
    }
    f.thread.join();
    if (state == KvLoadState::kDone) {
      for (size_t i = 0; i < f.recv.blocks.size(); ++i) {
        kv_->copy_block_from_host(*kernels_, f.recv.blocks[i], f.data.data() + i * static_cast<size_t>(shard_.block_bytes()));
      }
      counters_.received_blocks += static_cast<int64_t>(f.recv.blocks.size());
      counters_.received_bytes += f.received_bytes;
      counters_.transfer_seconds += f.seconds;
    } else {
      ++counters_.failed_transfers;
    }
    settled_[it->first] = state;
    it = fetches_.erase(it);
  }
}

KvConnectorOutput RemoteWorker::finish_step(const KvConnectorMetadata& meta) {
  if (!meta.sends.empty()) {
    // Copied out of the KV cache first, then kept under the lock (a reader copies out of a kept
    // prompt without it, so neither side waits for the other's copy).
    const auto now = Clock::now();
    std::vector<std::pair<KvRemoteSend, Staged>> kept;
    int64_t have = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      expire_locked(now);
      have = config_.kv_buffer_size - staged_bytes_;
    }
    std::vector<uint64_t> dropped;
    for (const KvRemoteSend& send : meta.sends) {
      const int64_t bytes = static_cast<int64_t>(send.blocks.size()) * shard_.block_bytes();
      bool sane = !send.blocks.empty();
      for (BlockId b : send.blocks) sane = sane && b >= 0 && b < kv_->num_blocks();
      if (!sane) continue;
      if (bytes > have) {
        log_line(LogLevel::kWarning, "kv",
                 "KV transfer: kv_buffer_size (" + std::to_string(config_.kv_buffer_size) + " bytes) is full; the "
                 "prompt of transfer " + std::to_string(send.transfer_id) + " is not kept (its decode instance "
                 "computes it)");
        dropped.push_back(send.transfer_id);
        continue;
      }
      auto data = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(bytes));
      for (size_t i = 0; i < send.blocks.size(); ++i) {
        kv_->copy_block_to_host(*kernels_, send.blocks[i], data->data() + i * static_cast<size_t>(shard_.block_bytes()));
      }
      Staged s;
      s.num_tokens = send.num_tokens;
      s.num_blocks = static_cast<int64_t>(send.blocks.size());
      s.prompt_hash = send.prompt_hash;
      s.data = std::move(data);
      s.read_by.assign(static_cast<size_t>(shard_.num_heads()), 0);
      s.expires = now + timeouts_.expiry;
      have -= bytes;
      counters_.staged_blocks += s.num_blocks;
      counters_.staged_bytes += bytes;
      kept.emplace_back(send, std::move(s));
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [send, s] : kept) {
      if (auto old = staged_.find(send.transfer_id); old != staged_.end()) {
        staged_bytes_ -= static_cast<int64_t>(old->second.data->size());
        staged_.erase(old);
      }
      staged_bytes_ += static_cast<int64_t>(s.data->size());
      staged_[send.transfer_id] = std::move(s);
    }
    for (uint64_t id : dropped) not_kept_[id] = now + timeouts_.expiry;
    staged_cv_.notify_all();
  }
  KvConnectorOutput out;
  for (RequestId id : meta.awaiting) {
    auto settled = settled_.find(id);
    if (settled != settled_.end()) {
      out.load_states.push_back(settled->second);
    } else {
      out.load_states.push_back(fetches_.count(id) ? KvLoadState::kPending : KvLoadState::kFailed);
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    counters_.sent_blocks += served_blocks_;
    counters_.sent_bytes += served_bytes_;
    served_blocks_ = served_bytes_ = 0;
  }
  out.counters = counters_;
  counters_ = KvTransferCounters{};
  return out;
}

}  // namespace pagoda
