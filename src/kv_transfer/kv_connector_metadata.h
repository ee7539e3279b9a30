// What a KV connector's scheduler side tells its worker side each step, and what comes back
// (vLLM v1's KVConnectorMetadata and KVConnectorOutput): plain values that travel inside the
// StepMessage and the ModelRunnerOutput (worker/step_message.h serialises them), so every rank of
// a tensor-parallel group does the same moves on its own shard of each block.
//
// The moves are between the device's KV cache blocks and a host-memory tier of slots (each slot
// holds one block of this rank's shard), and from a disk tier through the host:
//   stores: after the step's forward pass, copy a device block into a slot (and, with to_disk,
//           write it to the disk tier in the background);
//   loads:  copy slots (or disk files) into a request's device blocks; a slot is copied at the
//           start of the step, a disk file is read in the background and copied in at the start
//           of a later step. A request whose load is in flight waits (the scheduler schedules
//           none of its tokens) until every rank reports it done, or falls back to computing
//           the tokens when any rank reports it failed.
#pragma once

#include <cstdint>
#include <vector>

#include "base/types.h"
#include "kv_transfer/kv_block_key.h"

namespace pagoda {

struct KvTierStore {
  BlockId block = 0;   // device block, computed by this step
  int64_t slot = 0;    // host-tier slot it is copied into
  KvBlockKey key;
  bool to_disk = false;  // also written to the disk tier (in the background)

  bool operator==(const KvTierStore&) const = default;
};

struct KvTierLoadBlock {
  BlockId block = 0;   // device block of the request
  int64_t slot = -1;   // host-tier slot to copy from; -1: read the disk tier's file for `key`
  KvBlockKey key;

  bool operator==(const KvTierLoadBlock&) const = default;
};

struct KvTierLoad {
  RequestId request_id = 0;
  std::vector<KvTierLoadBlock> blocks;  // in the request's block order

  bool operator==(const KvTierLoad&) const = default;
};

struct KvConnectorMetadata {
  std::vector<KvTierLoad> loads;       // start these loads at the start of the step
  // Every request whose load is in flight (those started now included), in this order: each
  // worker reports their state in KvConnectorOutput::load_states. A worker forgets a load once
  // it is no longer listed (it ended on every rank, or the request ended while waiting).
  std::vector<RequestId> awaiting;
  std::vector<KvTierStore> stores;     // after the forward pass
  std::vector<KvBlockKey> disk_removes;  // files the disk tier drops (its capacity is reached)

  bool empty() const {
    return loads.empty() && awaiting.empty() && stores.empty() && disk_removes.empty();
  }
  bool operator==(const KvConnectorMetadata&) const = default;
};

enum class KvLoadState : uint8_t { kPending = 0, kDone = 1, kFailed = 2 };

// Counters of one step's moves on one worker (rank 0's are the engine's).
struct KvTransferCounters {
  int64_t loaded_blocks = 0, loaded_bytes = 0;        // into the device, from the host tier
  int64_t disk_loaded_blocks = 0, disk_loaded_bytes = 0;  // of those, read from the disk tier
  int64_t stored_blocks = 0, stored_bytes = 0;        // from the device into the host tier
  int64_t disk_stored_blocks = 0, disk_stored_bytes = 0;  // written to the disk tier
  int64_t failed_blocks = 0;                          // loads that failed (missing, corrupt)
  double load_seconds = 0, store_seconds = 0;         // time spent copying (engine thread)

  bool operator==(const KvTransferCounters&) const = default;
};

struct KvConnectorOutput {
  // Per KvConnectorMetadata::awaiting entry, its state on this worker (after a tensor-parallel
  // step, on every rank: done when every rank is done, failed when any failed).
  std::vector<KvLoadState> load_states;
  KvTransferCounters counters;

  bool operator==(const KvConnectorOutput&) const = default;
};

}  // namespace pagoda
