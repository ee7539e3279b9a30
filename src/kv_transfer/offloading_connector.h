// OffloadingConnector (vLLM's name): a tier of KV blocks in host memory beyond the KV cache, and
// optionally a second one on disk, so that a prefix whose blocks the cache has evicted, or that a
// server computed before it restarted, is loaded instead of recomputed.
//
// Every full block a request computes is saved once into the host tier (an LRU of slots, one
// block of this rank's shard each) after the step that computed it, and written through to the
// disk tier (a directory of checked files, kv_transfer/kv_disk_store.h) in the background. A
// block is known by its KvBlockKey, a SHA-256 chain over the model's fingerprint, the cache salt
// and the tokens up to its end, so a hit in either tier holds exactly the prefix asked for.
//
// When a request arrives, the blocks after its prefix-cache hit that a tier holds are loaded into
// its own blocks: from host slots at the start of the next step, from disk once the background
// reader has them (the request waits meanwhile; kv_transfer/kv_connector.h). A disk file that is
// missing, torn, corrupt or from another model fails the load: the file is dropped and the request
// computes those tokens.
//
// OffloadingScheduler is the scheduler side (the index of both tiers); OffloadingWorker is each
// worker's (the slots' memory and the disk I/O thread). Engine (or worker) thread only, except
// the worker's I/O thread, which shares only its queues with it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/sha256.h"
#include "kv_transfer/kv_connector.h"
#include "kv_transfer/kv_disk_store.h"
#include "kv_transfer/kv_transfer_config.h"
#include "tensor/tensor.h"

namespace pagoda {

struct OffloadingSchedulerConfig {
  int64_t block_size = 16;
  int64_t num_host_slots = 0;
  bool disk = false;
  int64_t disk_capacity_blocks = 0;
  Sha256Digest fingerprint{};           // the model and KV layout: the root of every key chain
  std::vector<KvBlockKey> disk_keys;    // the disk tier's files at start, oldest first
};

class OffloadingScheduler final : public KvConnectorScheduler {
 public:
  explicit OffloadingScheduler(OffloadingSchedulerConfig config);

  int64_t get_num_new_matched_tokens(const KvRequest& request, int64_t num_local_computed) override;
  void update_state_after_alloc(const KvRequest& request, std::span<const BlockId> blocks, int64_t num_local_computed,
                                int64_t num_external) override;
  void on_scheduled(const KvRequest& request, int64_t num_computed_after, std::span<const BlockId> blocks) override;
  KvConnectorMetadata build_meta() override;
  void update_connector_output(const KvConnectorMetadata& meta, const KvConnectorOutput& output,
                               std::vector<RequestId>& done, std::vector<RequestId>& failed) override;
  void request_finished(const KvRequest& request) override;
  KvConnectorStats stats() const override;

  // The key of each full block of `tokens` under `salt` (a request's chain), for tests.
  std::vector<KvBlockKey> keys_for(std::span<const TokenId> tokens, const std::string& salt) const;
  // Whether a tier holds `key` now (for tests).
  bool in_host_tier(const KvBlockKey& key) const { return host_.count(key) > 0; }
  bool in_disk_tier(const KvBlockKey& key) const { return disk_.count(key) > 0; }

 private:
  struct Slot {
    KvBlockKey key;
    int pins = 0;                        // loads reading it
    bool storing = false;                // a store of the step being built writes it: not evicted
    std::list<int64_t>::iterator lru;    // valid while the slot holds a key
  };
  struct DiskEntry {
    std::list<KvBlockKey>::iterator lru;
    int pins = 0;                        // loads reading it
  };
  struct PerRequest {
    std::vector<KvBlockKey> keys;        // of its full blocks, computed as they are needed
    int64_t num_seen_blocks = 0;         // blocks already saved (or found saved)
    int64_t num_queried_tokens = 0;      // the last get_num_new_matched_tokens's lookup
    bool loading = false;
    int64_t num_loading_tokens = 0;
    int64_t num_disk_blocks = 0;         // of the load, read from disk
    std::vector<int64_t> pinned_slots;
    std::vector<KvBlockKey> pinned_disk;
  };

  void extend_keys(PerRequest& r, const KvRequest& request, int64_t num_blocks) const;
  void touch(int64_t slot);
  int64_t take_slot();                   // a free or evicted slot, or -1 when every slot is pinned
  // Marks `key` most recently used on disk; false when the disk tier does not hold it.
  bool disk_touch(const KvBlockKey& key);
  // Adds `key` to the disk tier's index, dropping least recently used files beyond its capacity;
  // false when there is no room (every file is being read).
  bool disk_insert(const KvBlockKey& key);
  // The load of `r` ended: kDone, kFailed, or kPending for cancelled.
  void end_load(PerRequest& r, KvLoadState outcome);

  OffloadingSchedulerConfig config_;
  std::vector<Slot> slots_;
  std::vector<int64_t> free_slots_;
  std::list<int64_t> lru_;               // slots holding a key, least recently used first
  std::unordered_map<KvBlockKey, int64_t> host_;
  std::list<KvBlockKey> disk_lru_;
  std::unordered_map<KvBlockKey, DiskEntry> disk_;
  std::unordered_map<RequestId, PerRequest> requests_;
  KvConnectorMetadata next_;             // the next step's moves (awaiting aside)
  std::vector<RequestId> awaiting_;
  KvConnectorStats stats_;
};

class OffloadingWorker final : public KvConnectorWorker {
 public:
  // `shard_tag` keeps tensor-parallel ranks' files apart in one directory ("r0of2").
  OffloadingWorker(KvConnectorWorkerConfig config, std::string shard_tag);
  ~OffloadingWorker() override;  // writes what is queued for the disk, then stops the I/O thread

  Status register_kv_caches(const KvCacheTensors& kv, const Kernels& kernels) override;
  void start_step(const KvConnectorMetadata& meta, bool idle) override;
  KvConnectorOutput finish_step(const KvConnectorMetadata& meta) override;

 private:
  // One disk file being read for a load; the I/O thread fills `data` and sets `state`.
  struct DiskRead {
    KvBlockKey key;
    std::vector<uint8_t> data;
    KvLoadState state = KvLoadState::kPending;  // guarded by mu_
  };
  struct PendingLoad {
    std::vector<KvTierLoadBlock> disk_blocks;      // to copy in once read
    std::vector<std::shared_ptr<DiskRead>> reads;  // parallel to disk_blocks
    KvLoadState state = KvLoadState::kPending;
  };
  struct DiskWrite {
    KvBlockKey key;
    std::shared_ptr<const std::vector<uint8_t>> data;  // null: remove the file
  };

  uint8_t* slot(int64_t i) const { return slots_.as<uint8_t>() + i * block_bytes_; }
  void io_loop();
  void settle(PendingLoad& p);  // copies a load whose reads are all done into the device

  KvConnectorWorkerConfig config_;
  std::string shard_tag_;
  const KvCacheTensors* kv_ = nullptr;
  const Kernels* kernels_ = nullptr;
  int64_t block_bytes_ = 0;
  Buffer slots_;                                   // num_host_slots blocks, host memory
  std::unique_ptr<KvDiskStore> disk_;
  std::unordered_map<RequestId, PendingLoad> loads_;
  KvTransferCounters counters_;                    // this step's

  // Shared with the I/O thread.
  std::mutex mu_;
  std::condition_variable wake_io_, read_done_;
  std::deque<std::shared_ptr<DiskRead>> reads_;
  std::deque<DiskWrite> writes_;
  int64_t queued_write_bytes_ = 0;
  // Blocks queued for writing, by key: a read of one is answered from memory.
  std::unordered_map<KvBlockKey, std::shared_ptr<const std::vector<uint8_t>>> unwritten_;
  int64_t disk_written_blocks_ = 0, disk_written_bytes_ = 0;  // since the last finish_step
  std::vector<KvBlockKey> disk_dropped_;  // writes that did not happen, since the last finish_step
  bool stop_ = false;
  std::thread io_;
};

}  // namespace pagoda
