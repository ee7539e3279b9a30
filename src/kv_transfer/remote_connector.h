// TcpConnector and ShmConnector: KV blocks moved between a prefill instance (kv_producer) and a
// decode instance (kv_consumer) for disaggregated prefill (kv_transfer/kv_transfer_params.h says
// how a request is routed through them).
//
// Prefill side: when the step that computes a prompt's last token has run, each rank copies the
// prompt's blocks (its shard of their heads) out of the KV cache into host memory, kept under the
// request's transfer id until a decode instance has read every head, or until they expire (the
// memory is bounded by kv_buffer_size; what does not fit is not kept, and the decode side
// computes the prompt instead). Each rank serves them on kv_ip:kv_port + rank.
//
// Decode side: a request with do_remote_prefill waits (kWaitingForKv) while each rank fetches,
// in the background, its heads of every block from the prefill ranks that hold them (the two
// instances' tensor-parallel sizes may differ), checks the bytes, and copies them into the
// request's blocks at the start of a later step; every rank done, the request goes on from the
// prefill instance's first token. A refused handshake, an unknown or expired request, a dropped
// connection, a timeout or a corrupt or truncated message fails the load: the request computes
// its prompt itself, and nothing else is disturbed.
//
// The wire (one TCP connection per fetch; integers little-endian):
//   hello  client: "PKVT" u32 version, 32-byte transfer fingerprint, string description,
//                  i64 head_begin, i64 head_end (what it will ask for), u8 shm (1: the payloads
//                  through shared memory: the decode instance runs ShmConnector, on this host),
//                  i32 its rank, i32 its ranks (a head is freed once each decode rank holding
//                  it has read it)
//          server: u8 status (0 ok), string message, i64 its head_begin, i64 its head_end
//   read   client: u8 'R', u64 transfer id, 32-byte prompt hash (prompt_hash below: only the
//                  reader of the very prompt that was kept gets it), i64 head_begin, i64 head_end
//          server: u8 status (0 ok, 1 unknown or expired), i64 num_tokens, i64 num_blocks,
//                  u64 payload bytes, u64 XXH3-64 of the payload, then the payload (TcpConnector)
//                  or a string naming a POSIX shared memory object that holds it (ShmConnector;
//                  the client unlinks it once read). The payload is each block in turn, laid out
//                  as KvBlockLayout for the heads asked.
//   done   client: u8 'D', u64 transfer id, prompt hash, i64 head_begin, i64 head_end: those heads are read
//                  (sent, too, to a prefill rank that holds the same heads as the one read).
// Strings are u32 length + bytes (at most 4,096). Thread-safe where it says so: the server and
// the fetches run on threads of their own, sharing only the staged blocks (under a mutex).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv_transfer/kv_block_layout.h"
#include "kv_transfer/kv_connector.h"
#include "kv_transfer/kv_transfer_config.h"

namespace pagoda {

// The hash a transfer is kept and read under: SHA-256 over the cache salt and the prompt's tokens,
// so a decode instance reads only the KV of exactly the prompt it has.
std::array<uint8_t, 32> prompt_hash(std::string_view cache_salt, std::span<const TokenId> tokens);

class RemoteScheduler final : public KvConnectorScheduler {
 public:
  // `peers`: the prefill instances ("host:kv_port") a decode instance may load from; empty: any.
  RemoteScheduler(int64_t block_size, bool producer, bool consumer, std::vector<std::string> peers = {})
      : block_size_(block_size), producer_(producer), consumer_(consumer), peers_(std::move(peers)) {}

  int64_t get_num_new_matched_tokens(const KvRequest& request, int64_t num_local_computed) override;
  void update_state_after_alloc(const KvRequest& request, std::span<const BlockId> blocks, int64_t num_local_computed,
                                int64_t num_external) override;
  void on_scheduled(const KvRequest& request, int64_t num_computed_after, std::span<const BlockId> blocks) override;
  KvConnectorMetadata build_meta() override;
  void update_connector_output(const KvConnectorMetadata& meta, const KvConnectorOutput& output,
                               std::vector<RequestId>& done, std::vector<RequestId>& failed) override;
  void request_finished(const KvRequest& request) override;
  KvConnectorStats stats() const override;

 private:
  int64_t block_size_;
  bool producer_, consumer_;
  std::vector<std::string> peers_;
  bool warned_peer_ = false;
  std::unordered_map<RequestId, int64_t> loading_;  // request -> tokens being received
  std::unordered_set<RequestId> sent_;              // prefill requests whose blocks were kept
  KvConnectorMetadata next_;
  std::vector<RequestId> awaiting_;
  KvConnectorStats stats_;
};

// How long the two sides wait for each other.
struct RemoteTimeouts {
  std::chrono::milliseconds io{10000};       // a read or write on a connection that makes no progress
  std::chrono::milliseconds total{120000};   // one request's whole load
  std::chrono::milliseconds staged{5000};    // a server waits this long for a request's blocks to be kept
  std::chrono::milliseconds expiry{120000};  // kept blocks nobody read are dropped after this
};

class RemoteWorker final : public KvConnectorWorker {
 public:
  // `shard`: the heads this rank holds (of the whole model's `total_heads`); `rank`: its
  // tensor-parallel rank (it serves on kv_port + rank).
  RemoteWorker(KvConnectorWorkerConfig config, KvBlockLayout shard, int64_t total_heads, int rank,
               RemoteTimeouts timeouts = {});
  ~RemoteWorker() override;  // stops serving and abandons fetches in flight

  // Also starts serving (a producer): fails naming the address when it cannot listen.
  Status register_kv_caches(const KvCacheTensors& kv, const Kernels& kernels) override;
  void start_step(const KvConnectorMetadata& meta, bool idle) override;
  KvConnectorOutput finish_step(const KvConnectorMetadata& meta) override;

  // The port it serves on (kv_port + rank, or what the OS gave for kv_port 0); 0 when not serving.
  int port() const { return port_; }
  // Blocks kept for decode instances now, and their bytes (for tests).
  size_t num_staged() const;
  int64_t staged_bytes() const;

 private:
  struct Staged {
    int64_t num_tokens = 0;
    int64_t num_blocks = 0;
    std::array<uint8_t, 32> prompt_hash{};  // only a reader that names the same prompt gets it
    // num_blocks blocks in `shard_` layout; shared so that a reader copies out of it without
    // holding the lock.
    std::shared_ptr<const std::vector<uint8_t>> data;
    std::vector<uint64_t> read_by;   // per head of shard_: the decode ranks that read it
    std::chrono::steady_clock::time_point expires;
  };
  struct Connection {
    std::thread thread;
    std::atomic<bool> done{false};
    int fd = -1;
  };
  struct Fetch {
    KvRemoteRecv recv;
    std::vector<uint8_t> data;       // the received blocks in `shard_` layout
    std::atomic<bool> cancelled{false};
    std::mutex fd_mu;
    int fd = -1;                     // the connection in use (guarded by fd_mu), shut down by cancel()
    void cancel();
    std::atomic<int> state{0};       // KvLoadState, set by the fetch thread
    std::chrono::steady_clock::time_point deadline;  // of the whole load (RemoteTimeouts::total)
    int64_t received_bytes = 0;
    double seconds = 0;
    std::thread thread;
  };

  void serve_loop();
  void serve_connection(Connection* c);
  void fetch(Fetch* f);
  // Reads heads [begin, end) of every block from prefill rank `rank` into f->data, or with
  // read_them false only tells it they are read (another rank of it had them).
  Status fetch_from(Fetch* f, int rank, int64_t begin, int64_t end, bool read_them);
  void expire_locked(std::chrono::steady_clock::time_point now);

  KvConnectorWorkerConfig config_;
  KvBlockLayout shard_;
  int64_t total_heads_;
  int rank_;
  RemoteTimeouts timeouts_;
  bool shm_;  // fetch through shared memory (ShmConnector); a server answers either way
  const KvCacheTensors* kv_ = nullptr;
  const Kernels* kernels_ = nullptr;
  KvTransferCounters counters_;

  // Serving (producer).
  mutable std::mutex mu_;
  std::condition_variable staged_cv_;
  std::unordered_map<uint64_t, Staged> staged_;  // guarded by mu_
  // Transfers whose prompt was not kept (kv_buffer_size was full): a read is answered at once.
  std::unordered_map<uint64_t, std::chrono::steady_clock::time_point> not_kept_;  // guarded by mu_
  int64_t staged_bytes_ = 0;                     // guarded by mu_
  int64_t served_blocks_ = 0, served_bytes_ = 0; // guarded by mu_, since the last finish_step
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread server_;
  std::list<std::unique_ptr<Connection>> connections_;  // guarded by mu_; finished ones are joined as new ones come

  // Fetching (consumer): engine thread only.
  std::unordered_map<RequestId, std::unique_ptr<Fetch>> fetches_;
  std::vector<std::unique_ptr<Fetch>> abandoned_;  // cancelled, their threads still to join
  std::unordered_map<RequestId, KvLoadState> settled_;
  std::mutex fetch_mu_;
  std::condition_variable fetch_cv_;
};

// "PKVT" transfers: the fingerprint both sides must share (the model's weights, the KV cache's
// dtype and block size, the layers, KV heads and head size; not the tensor-parallel split).
std::array<uint8_t, 32> transfer_fingerprint(const std::array<uint8_t, 32>& weights, KvCacheDtype dtype,
                                             int64_t block_size, int64_t num_layers, int64_t num_kv_heads,
                                             int64_t head_dim);

}  // namespace pagoda
