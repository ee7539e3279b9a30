#include "kv_transfer/offloading_connector.h"

#include <algorithm>
#include <chrono>
#include <new>

#include "base/check.h"
#include "base/log.h"
#include "model/kv_cache.h"

namespace pagoda {
namespace {

// Writes queued for the disk beyond this many bytes are dropped (the tier is a cache; a block
// whose file never lands is computed again).
constexpr int64_t kMaxQueuedWriteBytes = int64_t{256} << 20;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

// ---- scheduler side --------------------------------------------------------------------------

OffloadingScheduler::OffloadingScheduler(OffloadingSchedulerConfig config) : config_(std::move(config)) {
  PAGODA_CHECK(config_.block_size > 0 && config_.num_host_slots > 0);
  slots_.resize(static_cast<size_t>(config_.num_host_slots));
  free_slots_.reserve(slots_.size());
  for (int64_t i = config_.num_host_slots - 1; i >= 0; --i) free_slots_.push_back(i);
  if (config_.disk) {
    for (const KvBlockKey& key : config_.disk_keys) disk_insert(key);
    config_.disk_keys.clear();
  }
  stats_.host_capacity = config_.num_host_slots;
  stats_.disk_capacity = config_.disk ? config_.disk_capacity_blocks : 0;
}

std::vector<KvBlockKey> OffloadingScheduler::keys_for(std::span<const TokenId> tokens, const std::string& salt) const {
  KvRequest r;
  r.tokens = tokens;
  r.cache_salt = salt;
  PerRequest per;
  extend_keys(per, r, static_cast<int64_t>(tokens.size()) / config_.block_size);
  return per.keys;
}

void OffloadingScheduler::extend_keys(PerRequest& r, const KvRequest& request, int64_t num_blocks) const {
  const int64_t bs = config_.block_size;
  num_blocks = std::min(num_blocks, request.num_tokens() / bs);
  while (static_cast<int64_t>(r.keys.size()) < num_blocks) {
    Sha256 h;
    if (r.keys.empty()) {
      // The chain's root: the model and KV layout, then the exact salt (length first, so that
      // no salt is a prefix of another's encoding).
      h.update(std::string_view("pagoda kv block chain v1"));
      h.update(std::span<const uint8_t>(config_.fingerprint));
      const uint64_t salt_len = request.cache_salt.size();
      h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(&salt_len), sizeof salt_len));
      h.update(request.cache_salt);
    } else {
      h.update(std::span<const uint8_t>(r.keys.back().bytes));
    }
    const size_t first = r.keys.size() * static_cast<size_t>(bs);
    h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(request.tokens.data() + first),
                                      static_cast<size_t>(bs) * sizeof(TokenId)));
    r.keys.push_back(KvBlockKey{h.finish()});
  }
}

int64_t OffloadingScheduler::get_num_new_matched_tokens(const KvRequest& request, int64_t num_local_computed) {
  PerRequest& r = requests_[request.id];
  r.num_queried_tokens = 0;
  if (!request.use_prefix_cache) return 0;
  const int64_t bs = config_.block_size;
  // As for the prefix cache: the last token is always computed, for its logits.
  const int64_t max_blocks = (request.num_tokens() - 1) / bs;
  const int64_t first = num_local_computed / bs;
  if (first >= max_blocks) return 0;
  r.num_queried_tokens = (max_blocks - first) * bs;
  extend_keys(r, request, max_blocks);
  int64_t n = 0;
  // The keys are chained, so the first block neither tier holds ends the hit.
  while (first + n < max_blocks) {
    const KvBlockKey& key = r.keys[static_cast<size_t>(first + n)];
    if (!host_.count(key) && !disk_.count(key)) break;
    ++n;
  }
  return n * bs;
}

void OffloadingScheduler::update_state_after_alloc(const KvRequest& request, std::span<const BlockId> blocks,
                                                   int64_t num_local_computed, int64_t num_external) {
  PerRequest& r = requests_[request.id];
  stats_.queries += r.num_queried_tokens;
  r.num_queried_tokens = 0;
  if (num_external <= 0) return;
  const int64_t bs = config_.block_size;
  const int64_t first = num_local_computed / bs;
  const int64_t count = num_external / bs;
  PAGODA_CHECK(num_local_computed % bs == 0 && num_external % bs == 0);
  PAGODA_CHECK(static_cast<int64_t>(blocks.size()) >= first + count &&
               static_cast<int64_t>(r.keys.size()) >= first + count);
  KvTierLoad load;
  load.request_id = request.id;
  for (int64_t i = first; i < first + count; ++i) {
    const KvBlockKey& key = r.keys[static_cast<size_t>(i)];
    KvTierLoadBlock b;
    b.block = blocks[static_cast<size_t>(i)];
    b.key = key;
    if (auto it = host_.find(key); it != host_.end()) {
      b.slot = it->second;
      ++slots_[static_cast<size_t>(b.slot)].pins;
      touch(b.slot);
      r.pinned_slots.push_back(b.slot);
    } else {
      auto d = disk_.find(key);
      PAGODA_CHECK(d != disk_.end());  // get_num_new_matched_tokens found it, and nothing ran since
      ++d->second.pins;
      disk_lru_.splice(disk_lru_.end(), disk_lru_, d->second.lru);
      r.pinned_disk.push_back(key);
      ++r.num_disk_blocks;
    }
    load.blocks.push_back(b);
  }
  r.loading = true;
  r.num_loading_tokens = num_external;
  next_.loads.push_back(std::move(load));
  awaiting_.push_back(request.id);
}

void OffloadingScheduler::touch(int64_t slot) {
  Slot& s = slots_[static_cast<size_t>(slot)];
  lru_.splice(lru_.end(), lru_, s.lru);
}

int64_t OffloadingScheduler::take_slot() {
  if (!free_slots_.empty()) {
    const int64_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  for (auto it = lru_.begin(); it != lru_.end(); ++it) {
    Slot& s = slots_[static_cast<size_t>(*it)];
    if (s.pins > 0 || s.storing) continue;
    const int64_t slot = *it;
    host_.erase(s.key);
    lru_.erase(it);
    return slot;
  }
  return -1;
}

bool OffloadingScheduler::disk_touch(const KvBlockKey& key) {
  auto it = disk_.find(key);
  if (it == disk_.end()) return false;
  disk_lru_.splice(disk_lru_.end(), disk_lru_, it->second.lru);
  return true;
}

bool OffloadingScheduler::disk_insert(const KvBlockKey& key) {
  if (config_.disk_capacity_blocks <= 0) return false;
  if (disk_touch(key)) return true;
  // Make room first: the least recently used files that no load is reading.
  for (auto it = disk_lru_.begin();
       static_cast<int64_t>(disk_.size()) >= config_.disk_capacity_blocks && it != disk_lru_.end();) {
    auto entry = disk_.find(*it);
    if (entry->second.pins > 0) {
      ++it;
      continue;
    }
    next_.disk_removes.push_back(*it);
    disk_.erase(entry);
    it = disk_lru_.erase(it);
  }
  if (static_cast<int64_t>(disk_.size()) >= config_.disk_capacity_blocks) return false;  // every file is being read
  disk_lru_.push_back(key);
  disk_.emplace(key, DiskEntry{std::prev(disk_lru_.end()), 0});
  return true;
}

void OffloadingScheduler::on_scheduled(const KvRequest& request, int64_t num_computed_after,
                                       std::span<const BlockId> blocks) {
  PerRequest& r = requests_[request.id];
  const int64_t full = std::min<int64_t>(num_computed_after, request.num_tokens()) / config_.block_size;
  if (full <= r.num_seen_blocks) return;
  extend_keys(r, request, full);
  for (int64_t i = r.num_seen_blocks; i < full; r.num_seen_blocks = ++i) {
    const KvBlockKey& key = r.keys[static_cast<size_t>(i)];
    if (auto it = host_.find(key); it != host_.end()) {
      touch(it->second);
      disk_touch(key);
      continue;
    }
    const int64_t slot = take_slot();
    if (slot < 0) break;  // every slot is being loaded from: save the rest when next scheduled
    Slot& s = slots_[static_cast<size_t>(slot)];
    s.key = key;
    s.storing = true;
    lru_.push_back(slot);
    s.lru = std::prev(lru_.end());
    host_[key] = slot;
    bool to_disk = false;
    if (config_.disk && !disk_touch(key)) to_disk = disk_insert(key);
    next_.stores.push_back(KvTierStore{blocks[static_cast<size_t>(i)], slot, key, to_disk});
  }
}

KvConnectorMetadata OffloadingScheduler::build_meta() {
  KvConnectorMetadata meta = std::move(next_);
  next_ = KvConnectorMetadata{};
  for (const KvTierStore& st : meta.stores) slots_[static_cast<size_t>(st.slot)].storing = false;
  meta.awaiting = awaiting_;
  return meta;
}

void OffloadingScheduler::end_load(PerRequest& r, KvLoadState outcome) {
  const bool ok = outcome != KvLoadState::kFailed;  // kPending here: cancelled
  for (int64_t slot : r.pinned_slots) --slots_[static_cast<size_t>(slot)].pins;
  for (const KvBlockKey& key : r.pinned_disk) {
    auto it = disk_.find(key);
    if (it == disk_.end()) continue;
    --it->second.pins;
    // A failed load may have failed on this file (the worker deleted a bad one): forget them all;
    // a good file is written again when the block is next computed.
    if (!ok) {
      disk_lru_.erase(it->second.lru);
      disk_.erase(it);
      next_.disk_removes.push_back(key);  // not left behind as a file nobody counts
    }
  }
  if (outcome == KvLoadState::kDone) {
    stats_.hits += r.num_loading_tokens;
    stats_.disk_hits += r.num_disk_blocks * config_.block_size;
  } else if (outcome == KvLoadState::kFailed) {
    ++stats_.failed_loads;
  }
  r.pinned_slots.clear();
  r.pinned_disk.clear();
  r.loading = false;
  r.num_loading_tokens = 0;
  r.num_disk_blocks = 0;
}

void OffloadingScheduler::update_connector_output(const KvConnectorMetadata& meta, const KvConnectorOutput& output,
                                                  std::vector<RequestId>& done, std::vector<RequestId>& failed) {
  stats_.moved += output.counters;
  // Files the disk tier did not write after all are not in it.
  for (const KvBlockKey& key : output.disk_dropped) {
    auto it = disk_.find(key);
    if (it == disk_.end() || it->second.pins > 0) continue;
    disk_lru_.erase(it->second.lru);
    disk_.erase(it);
  }
  // A report that does not match the step's list is a broken worker: every load fails (the
  // requests compute their tokens), rather than trusting it.
  const bool matches = output.load_states.size() == meta.awaiting.size();
  for (size_t i = 0; i < meta.awaiting.size(); ++i) {
    const RequestId id = meta.awaiting[i];
    auto it = requests_.find(id);
    if (it == requests_.end() || !it->second.loading) continue;  // cancelled since
    const KvLoadState state = matches ? output.load_states[i] : KvLoadState::kFailed;
    if (state == KvLoadState::kPending) continue;
    end_load(it->second, state);
    awaiting_.erase(std::remove(awaiting_.begin(), awaiting_.end(), id), awaiting_.end());
    (state == KvLoadState::kDone ? done : failed).push_back(id);
  }
}

void OffloadingScheduler::request_finished(const KvRequest& request) {
  auto it = requests_.find(request.id);
  if (it == requests_.end()) return;
  if (it->second.loading) {
    awaiting_.erase(std::remove(awaiting_.begin(), awaiting_.end(), request.id), awaiting_.end());
    end_load(it->second, KvLoadState::kPending);  // cancelled: neither a hit nor a failure
  }
  requests_.erase(it);
}

KvConnectorStats OffloadingScheduler::stats() const {
  KvConnectorStats s = stats_;
  s.host_blocks = static_cast<int64_t>(host_.size());
  s.disk_blocks = static_cast<int64_t>(disk_.size());
  s.requests_waiting = static_cast<int64_t>(awaiting_.size());
  return s;
}

// ---- worker side -----------------------------------------------------------------------------

OffloadingWorker::OffloadingWorker(KvConnectorWorkerConfig config, std::string shard_tag)
    : config_(std::move(config)), shard_tag_(std::move(shard_tag)) {}

OffloadingWorker::~OffloadingWorker() {
  // The I/O thread finishes the queued writes first (at most kMaxQueuedWriteBytes).
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_io_.notify_all();
  if (io_.joinable()) io_.join();
}

Status OffloadingWorker::register_kv_caches(const KvCacheTensors& kv, const Kernels& kernels) {
  kv_ = &kv;
  kernels_ = &kernels;
  block_bytes_ = kv.block_bytes();
  if (config_.num_host_slots < 1 || block_bytes_ < 1) {
    return invalid_argument("OffloadingConnector: the host tier needs at least one block");
  }
  try {
    slots_ = Buffer(static_cast<size_t>(config_.num_host_slots * block_bytes_));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("OffloadingConnector: cannot allocate a host tier of " +
                              std::to_string(config_.num_host_slots) + " blocks of " + std::to_string(block_bytes_) +
                              " bytes");
  }
  if (!config_.disk_path.empty()) {
    PAGODA_ASSIGN_OR_RETURN(disk_, KvDiskStore::open(config_.disk_path, config_.fingerprint, shard_tag_, block_bytes_));
    io_ = std::thread([this] { io_loop(); });
  }
  return Status::ok_status();
}

void OffloadingWorker::io_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_io_.wait(lock, [&] { return stop_ || !reads_.empty() || !writes_.empty(); });
    // Stopping, the queued writes still land (a restart finds them); nobody waits for reads.
    if (stop_ && writes_.empty()) return;
    // Reads first: a request is waiting for them; writes only keep the tier filled.
    if (!stop_ && !reads_.empty()) {
      std::shared_ptr<DiskRead> read = std::move(reads_.front());
      reads_.pop_front();
      lock.unlock();
      read->data.resize(static_cast<size_t>(block_bytes_));
      const Status st = disk_->read(read->key, read->data);
      if (!st.ok() && st.code() != StatusCode::kNotFound) log_line(LogLevel::kWarning, "kv", "KV disk tier: " + st.message());
      lock.lock();
      read->state = st.ok() ? KvLoadState::kDone : KvLoadState::kFailed;
      read_done_.notify_all();
      continue;
    }
    DiskWrite write = std::move(writes_.front());
    writes_.pop_front();
    lock.unlock();
    Status st = Status::ok_status();
    if (write.data) {
      st = disk_->write(write.key, *write.data);
      if (!st.ok()) log_line(LogLevel::kWarning, "kv", "KV disk tier: " + st.message());
    } else {
      disk_->remove(write.key);
    }
    lock.lock();
    if (write.data) {
      queued_write_bytes_ -= static_cast<int64_t>(write.data->size());
      auto it = unwritten_.find(write.key);
      if (it != unwritten_.end() && it->second == write.data) unwritten_.erase(it);
      if (st.ok()) {
        ++disk_written_blocks_;
        disk_written_bytes_ += static_cast<int64_t>(write.data->size());
      } else {
        disk_dropped_.push_back(write.key);
      }
    }
  }
}

void OffloadingWorker::settle(PendingLoad& p) {
  if (p.state != KvLoadState::kPending) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& read : p.reads) {
      if (read->state == KvLoadState::kPending) return;
    }
    for (const auto& read : p.reads) {
      if (read->state == KvLoadState::kFailed) p.state = KvLoadState::kFailed;
    }
  }
  if (p.state == KvLoadState::kFailed) {
    counters_.failed_blocks += static_cast<int64_t>(p.reads.size());
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < p.reads.size(); ++i) {
    kv_->copy_block_from_host(*kernels_, p.disk_blocks[i].block, p.reads[i]->data.data());
  }
  counters_.loaded_blocks += static_cast<int64_t>(p.reads.size());
  counters_.loaded_bytes += static_cast<int64_t>(p.reads.size()) * block_bytes_;
  counters_.disk_loaded_blocks += static_cast<int64_t>(p.reads.size());
  counters_.disk_loaded_bytes += static_cast<int64_t>(p.reads.size()) * block_bytes_;
  counters_.load_seconds += seconds_since(start);
  p.reads.clear();
  p.disk_blocks.clear();
  p.state = KvLoadState::kDone;
}

void OffloadingWorker::start_step(const KvConnectorMetadata& meta, bool idle) {
  PAGODA_CHECK(kv_ != nullptr);
  // A load the scheduler no longer awaits ended (reported done or failed by every rank) or was
  // cancelled; a read still in flight for it finishes into nothing.
  for (auto it = loads_.begin(); it != loads_.end();) {
    const bool awaited = std::find(meta.awaiting.begin(), meta.awaiting.end(), it->first) != meta.awaiting.end();
    it = awaited ? std::next(it) : loads_.erase(it);
  }
  const auto start = std::chrono::steady_clock::now();
  for (const KvTierLoad& load : meta.loads) {
    PendingLoad& p = loads_[load.request_id];
    p = PendingLoad{};
    for (const KvTierLoadBlock& b : load.blocks) {
      if (b.slot >= 0 && b.slot < config_.num_host_slots && b.block >= 0 && b.block < kv_->num_blocks()) {
        kv_->copy_block_from_host(*kernels_, b.block, slot(b.slot));
        ++counters_.loaded_blocks;
        counters_.loaded_bytes += block_bytes_;
        continue;
      }
      auto read = std::make_shared<DiskRead>();
      read->key = b.key;
      // A slot or block out of range, or a disk block without a disk tier, is a broken message:
      // the load fails.
      const bool readable = disk_ != nullptr && b.slot == -1 && b.block >= 0 && b.block < kv_->num_blocks();
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!readable) {
          read->state = KvLoadState::kFailed;
        } else if (auto it = unwritten_.find(b.key); it != unwritten_.end()) {
          read->data = *it->second;  // still queued for the disk
          read->state = KvLoadState::kDone;
        } else {
          reads_.push_back(read);
        }
      }
      p.disk_blocks.push_back(b);
      p.reads.push_back(std::move(read));
    }
  }
  if (!meta.loads.empty()) wake_io_.notify_one();
  counters_.load_seconds += seconds_since(start);
  if (idle && !loads_.empty()) {
    // Nothing else to do this step: wait a little for the reads rather than spin through empty
    // steps.
    std::unique_lock<std::mutex> lock(mu_);
    read_done_.wait_for(lock, std::chrono::milliseconds(5), [&] {
      for (const auto& [id, p] : loads_) {
        for (const auto& read : p.reads) {
          if (read->state == KvLoadState::kPending) return false;
        }
      }
      return true;
    });
  }
  for (auto& [id, p] : loads_) settle(p);
}

KvConnectorOutput OffloadingWorker::finish_step(const KvConnectorMetadata& meta) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<DiskWrite> writes;
  for (const KvTierStore& st : meta.stores) {
    if (st.slot < 0 || st.slot >= config_.num_host_slots || st.block < 0 || st.block >= kv_->num_blocks()) continue;
    kv_->copy_block_to_host(*kernels_, st.block, slot(st.slot));
    ++counters_.stored_blocks;
    counters_.stored_bytes += block_bytes_;
    if (st.to_disk && disk_) {
      writes.push_back(DiskWrite{st.key, std::make_shared<const std::vector<uint8_t>>(slot(st.slot),
                                                                                        slot(st.slot) + block_bytes_)});
    }
  }
  counters_.store_seconds += seconds_since(start);
  if (disk_) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const KvBlockKey& key : meta.disk_removes) {
      unwritten_.erase(key);
      writes_.push_back(DiskWrite{key, nullptr});
    }
    for (DiskWrite& w : writes) {
      if (queued_write_bytes_ + block_bytes_ > kMaxQueuedWriteBytes) {  // the disk is behind: drop it
        disk_dropped_.push_back(w.key);
        continue;
      }
      queued_write_bytes_ += block_bytes_;
      unwritten_[w.key] = w.data;
      writes_.push_back(std::move(w));
    }
    counters_.disk_stored_blocks += disk_written_blocks_;
    counters_.disk_stored_bytes += disk_written_bytes_;
    disk_written_blocks_ = disk_written_bytes_ = 0;
  }
  if (disk_ && (!writes.empty() || !meta.disk_removes.empty())) wake_io_.notify_one();

  KvConnectorOutput out;
  out.load_states.reserve(meta.awaiting.size());
  for (RequestId id : meta.awaiting) {
    auto it = loads_.find(id);
    // A load this worker never heard of cannot be done here.
    const KvLoadState state = it == loads_.end() ? KvLoadState::kFailed : it->second.state;
    // Kept until the scheduler stops asking: another rank may not be done yet.
    out.load_states.push_back(state);
  }
  out.counters = counters_;
  counters_ = KvTransferCounters{};
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.disk_dropped = std::move(disk_dropped_);
    disk_dropped_.clear();
  }
  return out;
}

}  // namespace pagoda
