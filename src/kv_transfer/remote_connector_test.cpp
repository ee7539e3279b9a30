// RemoteWorker on real KV caches over localhost: blocks move between instances of different
// tensor-parallel splits byte for byte (every dtype's layout, int8 scales included), kept blocks
// are freed once read or expired, and every fault (a refused handshake, an unknown request, a
// dropped, truncated, corrupted or slow answer, nobody listening) ends in a failed load or a
// slower one, never a wrong block or a hang.
#include "kv_transfer/remote_connector.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>
#include <xxhash.h>

#include <gtest/gtest.h>

#include <functional>
#include <random>
#include <thread>

#include "backend/cpu/cpu_backend.h"
#include "model/kv_cache.h"
#include "model/tensor_parallel.h"
#include "support/free_ports.h"

namespace pagoda {
namespace {

using namespace std::chrono_literals;

constexpr int64_t kLayers = 3, kHeads = 4, kHeadDim = 8, kBlockSize = 4, kBlocks = 8;

const Kernels& kernels() {
  static std::unique_ptr<Backend> backend = [] {
    cpu::register_cpu_backend();
    return std::move(create_backend("cpu")).value();
  }();
  return backend->kernels();
}

int free_port(int n = 8) { return testing::free_tcp_ports(n); }

// One rank's KV cache (its heads of kHeads) filled with bytes that say where they are.
struct Rank {
  KvBlockLayout layout;
  KvCacheTensors kv;
  std::unique_ptr<RemoteWorker> worker;
};

KvConnectorWorkerConfig worker_config(const std::string& connector, const std::string& role, int port,
                                      uint8_t fingerprint = 1) {
  KvConnectorWorkerConfig c;
  c.connector = connector;
  c.kv_role = role;
  c.engine_id = "test";
  c.kv_ip = "127.0.0.1";
  c.kv_port = port;
  c.kv_buffer_size = 1 << 20;
  c.transfer_fingerprint[0] = fingerprint;
  c.transfer_description = "fingerprint " + std::to_string(fingerprint);
  return c;
}

std::unique_ptr<Rank> make_rank(KvCacheDtype dtype, int rank, int size, const KvConnectorWorkerConfig& config,
                                RemoteTimeouts timeouts = {}) {
  auto r = std::make_unique<Rank>();
  ModelConfig mc;
  mc.num_layers = kLayers;
  mc.num_kv_heads = kHeads / size >= 1 ? kHeads / size : 1;
  mc.head_dim = kHeadDim;
  const IndexRange heads = kv_head_range(kHeads, rank, size);
  r->layout = KvBlockLayout{kLayers, kBlockSize, heads.begin, heads.end, kHeadDim, dtype};
  auto kv = KvCacheTensors::allocate(kernels(), mc, kBlocks, kBlockSize, dtype);
  EXPECT_TRUE(kv.ok());
  r->kv = std::move(*kv);
  KvConnectorWorkerConfig ranked = config;
  ranked.tp_size = size;
  r->worker = std::make_unique<RemoteWorker>(ranked, r->layout, kHeads, rank, timeouts);
  EXPECT_TRUE(r->worker->register_kv_caches(r->kv, kernels()).ok());
  return r;
}

// The byte of (block, layer, piece, slot, head, byte within the row) as the producer writes it:
// a function of where it is in the whole model, so any rank's copy of a head agrees.
uint8_t mark(int64_t block, int64_t layer, int piece, int64_t slot, int64_t head, int64_t i) {
  return static_cast<uint8_t>(block * 131 + layer * 71 + piece * 37 + slot * 17 + head * 7 + i * 3 + 1);
}

int64_t row_bytes(KvCacheDtype dtype, int piece) {
  return piece >= 2 ? 4 : kHeadDim * kv_cache_elem_bytes(dtype);
}

// Fills (or checks) block `block` of rank r's cache as block `as` of the whole model.
void fill(Rank& r, BlockId block, int64_t as) {
  std::vector<uint8_t> bytes(static_cast<size_t>(r.layout.block_bytes()));
  uint8_t* p = bytes.data();
  const int pieces = r.layout.dtype == KvCacheDtype::kInt8 ? 4 : 2;
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int piece = 0; piece < pieces; ++piece) {
      for (int64_t s = 0; s < kBlockSize; ++s) {
        for (int64_t h = r.layout.head_begin; h < r.layout.head_end; ++h) {
          for (int64_t i = 0; i < row_bytes(r.layout.dtype, piece); ++i) *p++ = mark(as, l, piece, s, h, i);
        }
      }
    }
  }
  r.kv.copy_block_from_host(kernels(), block, bytes.data());
}

::testing::AssertionResult holds(Rank& r, BlockId block, int64_t as) {
  std::vector<uint8_t> bytes(static_cast<size_t>(r.layout.block_bytes()));
  r.kv.copy_block_to_host(kernels(), block, bytes.data());
  const uint8_t* p = bytes.data();
  const int pieces = r.layout.dtype == KvCacheDtype::kInt8 ? 4 : 2;
  for (int64_t l = 0; l < kLayers; ++l) {
    for (int piece = 0; piece < pieces; ++piece) {
      for (int64_t s = 0; s < kBlockSize; ++s) {
        for (int64_t h = r.layout.head_begin; h < r.layout.head_end; ++h) {
          for (int64_t i = 0; i < row_bytes(r.layout.dtype, piece); ++i) {
            if (*p++ != mark(as, l, piece, s, h, i)) {
              return ::testing::AssertionFailure() << "block " << block << " layer " << l << " piece " << piece
                                                   << " slot " << s << " head " << h << " byte " << i;
            }
          }
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Runs steps of `r` until request 1's load is no longer pending; its final state.
KvLoadState wait_load(Rank& r, const KvRemoteRecv& recv) {
  KvConnectorMetadata m;
  m.recvs = {recv};
  m.awaiting = {recv.request_id};
  for (int i = 0; i < 4000; ++i) {
    r.worker->start_step(m, /*idle=*/true);
    const KvConnectorOutput out = r.worker->finish_step(m);
    EXPECT_EQ(out.load_states.size(), 1u);
    if (out.load_states[0] != KvLoadState::kPending) return out.load_states[0];
    m.recvs.clear();
  }
  return KvLoadState::kPending;
}

KvRemoteRecv recv_of(int port, int tp, uint64_t id, std::vector<BlockId> blocks, int64_t first_block = 0) {
  KvRemoteRecv r;
  r.request_id = 1;
  r.host = "127.0.0.1";
  r.port = port;
  r.tp_size = tp;
  r.transfer_id = id;
  r.first_block = first_block;
  r.num_tokens = (first_block + static_cast<int64_t>(blocks.size())) * kBlockSize - 1;
  r.blocks = std::move(blocks);
  return r;
}

// Prefill on `from` ranks, decode on `to` ranks: every decode rank ends up with its heads of the
// three blocks, in its own blocks, whatever the two splits and the data plane.
TEST(RemoteWorker, MovesEveryHeadAcrossTensorParallelSplits) {
  for (KvCacheDtype dtype : {KvCacheDtype::kF32, KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3, KvCacheDtype::kInt8}) {
    for (const auto& [from, to, connector] : std::vector<std::tuple<int, int, std::string>>{
             {1, 1, "TcpConnector"}, {2, 1, "TcpConnector"}, {1, 2, "ShmConnector"}, {2, 4, "TcpConnector"},
             {4, 2, "ShmConnector"}, {8, 1, "TcpConnector"}}) {
      SCOPED_TRACE(std::string(kv_cache_dtype_name(dtype)) + " " + std::to_string(from) + " -> " +
                   std::to_string(to) + " " + connector);
      const int port = free_port();
      std::vector<std::unique_ptr<Rank>> prefill;
      for (int r = 0; r < from; ++r) {
        prefill.push_back(make_rank(dtype, r, from, worker_config("TcpConnector", "kv_producer", port)));
        for (int64_t b = 0; b < 3; ++b) fill(*prefill.back(), static_cast<BlockId>(b + 2), b);
        KvConnectorMetadata keep;
        keep.sends = {KvRemoteSend{.transfer_id = 42, .num_tokens = 3 * kBlockSize - 1, .blocks = {2, 3, 4}}};
        prefill.back()->worker->start_step(keep, false);
        const KvConnectorOutput out = prefill.back()->worker->finish_step(keep);
        EXPECT_EQ(out.counters.staged_blocks, 3);
        EXPECT_EQ(prefill.back()->worker->num_staged(), 1u);
      }
      for (int r = 0; r < to; ++r) {
        auto decode = make_rank(dtype, r, to, worker_config(connector, "kv_consumer", 0));
        EXPECT_EQ(wait_load(*decode, recv_of(port, from, 42, {7, 1, 5})), KvLoadState::kDone);
        EXPECT_TRUE(holds(*decode, 7, 0));
        EXPECT_TRUE(holds(*decode, 1, 1));
        EXPECT_TRUE(holds(*decode, 5, 2));
      }
      // Every head read by someone: each prefill rank let go of its blocks.
      for (auto& p : prefill) {
        for (int i = 0; i < 200 && p->worker->num_staged() > 0; ++i) std::this_thread::sleep_for(5ms);
        EXPECT_EQ(p->worker->num_staged(), 0u);
        EXPECT_EQ(p->worker->staged_bytes(), 0);
      }
    }
  }
}

// A decode instance with the first block cached reads the rest; kept blocks nobody reads expire;
// an unknown request fails (after the short wait for it to be kept); kv_buffer_size bounds
// what is kept.
TEST(RemoteWorker, PartialReadsExpiryUnknownRequestsAndTheBufferBound) {
  const int port = free_port();
  RemoteTimeouts t;
  t.staged = 50ms;
  t.expiry = 300ms;
  KvConnectorWorkerConfig pc = worker_config("TcpConnector", "kv_producer", port);
  auto prefill = make_rank(KvCacheDtype::kF16, 0, 1, pc, t);
  for (int64_t b = 0; b < 3; ++b) fill(*prefill, static_cast<BlockId>(b), b);
  KvConnectorMetadata keep;
  keep.sends = {KvRemoteSend{.transfer_id = 5, .num_tokens = 12, .blocks = {0, 1, 2}}, KvRemoteSend{.transfer_id = 6, .num_tokens = 12, .blocks = {0, 1, 2}}};
  prefill->worker->start_step(keep, false);
  prefill->worker->finish_step(keep);
  EXPECT_EQ(prefill->worker->num_staged(), 2u);
  auto decode = make_rank(KvCacheDtype::kF16, 0, 1, worker_config("TcpConnector", "kv_consumer", 0));
  KvRemoteRecv partial = recv_of(port, 1, 5, {6, 7}, /*first_block=*/1);
  partial.num_tokens = 12;
  EXPECT_EQ(wait_load(*decode, partial), KvLoadState::kDone);
  EXPECT_TRUE(holds(*decode, 6, 1));
  EXPECT_TRUE(holds(*decode, 7, 2));
  EXPECT_EQ(wait_load(*decode, recv_of(port, 1, 999, {3})), KvLoadState::kFailed);
  // Transfer 6 is never read: gone once it expires (checked when something is next kept).
  std::this_thread::sleep_for(350ms);
  KvConnectorMetadata later;
  later.sends = {KvRemoteSend{.transfer_id = 8, .num_tokens = 4, .blocks = {0}}};
  prefill->worker->start_step(later, false);
  prefill->worker->finish_step(later);
  EXPECT_EQ(prefill->worker->num_staged(), 1u);  // 8 alone
  // A buffer of one block keeps nothing bigger.
  KvConnectorWorkerConfig small = pc;
  small.kv_buffer_size = prefill->layout.block_bytes();
  small.kv_port = free_port();
  auto bounded = make_rank(KvCacheDtype::kF16, 0, 1, small, t);
  bounded->worker->start_step(keep, false);
  bounded->worker->finish_step(keep);
  EXPECT_EQ(bounded->worker->num_staged(), 0u);
}

// A reader that names another prompt (another hash of the salt and tokens) gets nothing.
TEST(RemoteWorker, OnlyTheSamePromptIsRead) {
  const int port = free_port();
  auto prefill = make_rank(KvCacheDtype::kF32, 0, 1, worker_config("TcpConnector", "kv_producer", port),
                           RemoteTimeouts{10000ms, 120000ms, 50ms, 120000ms});
  fill(*prefill, 0, 0);
  KvConnectorMetadata keep;
  KvRemoteSend send{.transfer_id = 12, .num_tokens = 3, .blocks = {0}};
  const std::vector<TokenId> tokens{5, 6, 7};
  send.prompt_hash = prompt_hash("", tokens);
  keep.sends = {send};
  prefill->worker->start_step(keep, false);
  prefill->worker->finish_step(keep);
  auto decode = make_rank(KvCacheDtype::kF32, 0, 1, worker_config("TcpConnector", "kv_consumer", 0));
  KvRemoteRecv other = recv_of(port, 1, 12, {2});
  other.num_tokens = 3;
  other.prompt_hash = prompt_hash("tenant", tokens);  // the same tokens under another salt
  EXPECT_EQ(wait_load(*decode, other), KvLoadState::kFailed);
  KvRemoteRecv same = other;
  same.prompt_hash = prompt_hash("", tokens);
  EXPECT_EQ(wait_load(*decode, same), KvLoadState::kDone);
  EXPECT_TRUE(holds(*decode, 2, 0));
}

// Another model or KV layout is refused at the handshake: the load fails, nothing is read.
TEST(RemoteWorker, AMismatchedLayoutIsRefused) {
  const int port = free_port();
  auto prefill = make_rank(KvCacheDtype::kF32, 0, 1, worker_config("TcpConnector", "kv_producer", port, 1));
  fill(*prefill, 0, 0);
  KvConnectorMetadata keep;
  keep.sends = {KvRemoteSend{.transfer_id = 9, .num_tokens = 4, .blocks = {0}}};
  prefill->worker->start_step(keep, false);
  prefill->worker->finish_step(keep);
  auto decode = make_rank(KvCacheDtype::kF32, 0, 1, worker_config("TcpConnector", "kv_consumer", 0, 2));
  EXPECT_EQ(wait_load(*decode, recv_of(port, 1, 9, {3})), KvLoadState::kFailed);
  EXPECT_EQ(prefill->worker->num_staged(), 1u);
}

// A hand-written server that answers a read as `answer` says.
class FakeServer {
 public:
  explicit FakeServer(std::function<void(int fd)> answer) : answer_(std::move(answer)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    socklen_t len = sizeof a;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    ::listen(fd_, 4);
    thread_ = std::thread([this] {
      const int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      answer_(c);
      ::close(c);
    });
  }
  ~FakeServer() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  int port() const { return port_; }

 private:
  std::function<void(int)> answer_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
};

void read_into(int fd, uint8_t* b, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t k = ::recv(fd, b + got, n - got, 0);
    if (k <= 0) return;
    got += static_cast<size_t>(k);
  }
}

void skip_bytes(int fd, size_t n) {
  std::vector<uint8_t> b(n);
  read_into(fd, b.data(), n);
}

template <class T>
void put(std::vector<uint8_t>& b, T v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  b.insert(b.end(), p, p + sizeof v);
}

// Reads the client's hello and read, answers the hello with OK and the read with `payload`
// (claiming `claimed` bytes and `checksum`), in `pieces` writes `delay` apart; then closes.
std::function<void(int)> answer_with(std::vector<uint8_t> payload, uint64_t claimed, uint64_t checksum,
                                     int pieces = 1, std::chrono::milliseconds delay = 0ms) {
  return [=](int fd) {
    uint8_t head[4 + 4 + 32 + 4] = {};
    read_into(fd, head, sizeof head);
    uint32_t len = 0;
    std::memcpy(&len, head + 40, 4);
    skip_bytes(fd, len + 8 + 8 + 1 + 4 + 4);
    std::vector<uint8_t> ok;
    put<uint8_t>(ok, 0);
    put<uint32_t>(ok, 0);
    put<int64_t>(ok, 0);
    put<int64_t>(ok, kHeads);
    ::send(fd, ok.data(), ok.size(), MSG_NOSIGNAL);
    skip_bytes(fd, 1 + 8 + 32 + 8 + 8);
    std::vector<uint8_t> a;
    put<uint8_t>(a, 0);
    put<int64_t>(a, kBlockSize - 1);
    put<int64_t>(a, 1);
    put<uint64_t>(a, claimed);
    put<uint64_t>(a, checksum);
    a.insert(a.end(), payload.begin(), payload.end());
    const size_t step = (a.size() + static_cast<size_t>(pieces) - 1) / static_cast<size_t>(pieces);
    for (size_t at = 0; at < a.size(); at += step) {
      ::send(fd, a.data() + at, std::min(step, a.size() - at), MSG_NOSIGNAL);
      std::this_thread::sleep_for(delay);
    }
  };
}

TEST(RemoteWorker, FaultsFailTheLoadAndASlowLinkOnlyDelaysIt) {
  auto decode = make_rank(KvCacheDtype::kF32, 0, 1, worker_config("TcpConnector", "kv_consumer", 0),
                          RemoteTimeouts{300ms, 120000ms, 50ms, 1000ms});
  const int64_t bytes = decode->layout.block_bytes();
  std::vector<uint8_t> good(static_cast<size_t>(bytes));
  for (size_t i = 0; i < good.size(); ++i) good[i] = static_cast<uint8_t>(i * 7 + 3);
  const uint64_t sum = XXH3_64bits(good.data(), good.size());
  {
    SCOPED_TRACE("a good answer, in 20 pieces 10 ms apart (a slow link)");
    FakeServer s(answer_with(good, static_cast<uint64_t>(bytes), sum, 20, 10ms));
    EXPECT_EQ(wait_load(*decode, recv_of(s.port(), 1, 1, {4})), KvLoadState::kDone);
    std::vector<uint8_t> back(good.size());
    decode->kv.copy_block_to_host(kernels(), 4, back.data());
    EXPECT_EQ(back, good);
  }
  std::vector<uint8_t> flipped = good;
  flipped[flipped.size() / 2] ^= 1;
  {
    SCOPED_TRACE("a corrupted payload");
    FakeServer s(answer_with(flipped, static_cast<uint64_t>(bytes), sum));
    EXPECT_EQ(wait_load(*decode, recv_of(s.port(), 1, 1, {4})), KvLoadState::kFailed);
  }
  {
    SCOPED_TRACE("a truncated payload, then the connection closes");
    FakeServer s(answer_with(std::vector<uint8_t>(good.begin(), good.begin() + bytes / 2), static_cast<uint64_t>(bytes), sum));
    EXPECT_EQ(wait_load(*decode, recv_of(s.port(), 1, 1, {4})), KvLoadState::kFailed);
  }
  {
    SCOPED_TRACE("a payload size that does not match the blocks");
    FakeServer s(answer_with(good, static_cast<uint64_t>(bytes) * 1000, sum));
    EXPECT_EQ(wait_load(*decode, recv_of(s.port(), 1, 1, {4})), KvLoadState::kFailed);
  }
  {
    SCOPED_TRACE("a server that stops answering halfway (longer than the I/O timeout)");
    FakeServer s(answer_with(good, static_cast<uint64_t>(bytes), sum, 2, 1500ms));
    EXPECT_EQ(wait_load(*decode, recv_of(s.port(), 1, 1, {4})), KvLoadState::kFailed);
  }
  {
    SCOPED_TRACE("a connection dropped before the answer");
    FakeServer s([](int fd) { skip_bytes(fd, 4); });
    EXPECT_EQ(wait_load(*decode, recv_of(s.port(), 1, 1, {4})), KvLoadState::kFailed);
  }
  {
    SCOPED_TRACE("nobody listening");
    EXPECT_EQ(wait_load(*decode, recv_of(free_port(), 1, 1, {4})), KvLoadState::kFailed);
  }
  {
    SCOPED_TRACE("a block id out of range in the step message");
    EXPECT_EQ(wait_load(*decode, recv_of(free_port(), 1, 1, {static_cast<BlockId>(kBlocks)})), KvLoadState::kFailed);
  }
}

}  // namespace
}  // namespace pagoda
