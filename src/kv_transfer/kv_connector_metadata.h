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

#include <array>
#include <cstdint>
#include <string>
#include <utility>
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

// A prompt's blocks a prefill instance keeps for a decode instance to read (TcpConnector,
// ShmConnector): copied out after the step's forward pass, which computed their last token.
struct KvRemoteSend {
  uint64_t transfer_id = 0;
  std::array<uint8_t, 32> prompt_hash{};  // remote_connector.h's prompt_hash
  int64_t num_tokens = 0;
  std::vector<BlockId> blocks;  // covering num_tokens

  bool operator==(const KvRemoteSend&) const = default;
};

// A decode instance's load of a request's prompt from a prefill instance, in the background.
struct KvRemoteRecv {
  RequestId request_id = 0;
  std::string host;
  int32_t port = 0;              // the prefill instance's rank 0; rank r listens on port + r
  int32_t tp_size = 1;           // its tensor-parallel ranks
  uint64_t transfer_id = 0;
  std::array<uint8_t, 32> prompt_hash{};  // of this request's prompt: the prefill instance's must be the same
  int64_t num_tokens = 0;        // the tokens it holds (the prompt)
  int64_t first_block = 0;       // its blocks before this one are not read (a local prefix hit)
  std::vector<BlockId> blocks;   // where its blocks first_block, first_block + 1, ... go

  bool operator==(const KvRemoteRecv&) const = default;
};

struct KvConnectorMetadata {
  std::vector<KvTierLoad> loads;       // start these loads at the start of the step
  // Every request whose load is in flight (those started now included), in this order: each
  // worker reports their state in KvConnectorOutput::load_states. A worker forgets a load once
  // it is no longer listed (it ended on every rank, or the request ended while waiting).
  std::vector<RequestId> awaiting;
  std::vector<KvTierStore> stores;     // after the forward pass
  std::vector<KvBlockKey> disk_removes;  // files the disk tier drops (its capacity is reached)
  std::vector<KvRemoteRecv> recvs;     // start these at the start of the step (awaited like loads)
  std::vector<KvRemoteSend> sends;     // after the forward pass

  bool empty() const {
    return loads.empty() && awaiting.empty() && stores.empty() && disk_removes.empty() && recvs.empty() &&
           sends.empty();
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
  int64_t staged_blocks = 0, staged_bytes = 0;        // kept for decode instances
  int64_t sent_blocks = 0, sent_bytes = 0;            // served to decode instances (since the last step)
  int64_t received_blocks = 0, received_bytes = 0;    // received from prefill instances
  int64_t failed_transfers = 0;                       // receives that failed
  double transfer_seconds = 0;                        // receives, from start to the last byte
  double load_seconds = 0, store_seconds = 0;         // time spent copying (engine thread)

  KvTransferCounters& operator+=(const KvTransferCounters& c) {
    for (auto [to, from] : {std::pair{&loaded_blocks, c.loaded_blocks}, {&loaded_bytes, c.loaded_bytes},
                            {&disk_loaded_blocks, c.disk_loaded_blocks}, {&disk_loaded_bytes, c.disk_loaded_bytes},
                            {&stored_blocks, c.stored_blocks}, {&stored_bytes, c.stored_bytes},
                            {&disk_stored_blocks, c.disk_stored_blocks}, {&disk_stored_bytes, c.disk_stored_bytes},
                            {&failed_blocks, c.failed_blocks}, {&staged_blocks, c.staged_blocks},
                            {&staged_bytes, c.staged_bytes}, {&sent_blocks, c.sent_blocks}, {&sent_bytes, c.sent_bytes},
                            {&received_blocks, c.received_blocks}, {&received_bytes, c.received_bytes},
                            {&failed_transfers, c.failed_transfers}}) {
      *to += from;
    }
    transfer_seconds += c.transfer_seconds;
    load_seconds += c.load_seconds;
    store_seconds += c.store_seconds;
    return *this;
  }
  bool operator==(const KvTransferCounters&) const = default;
};

struct KvConnectorOutput {
  // Per KvConnectorMetadata::awaiting entry, its state on this worker (after a tensor-parallel
  // step, on every rank: done when every rank is done, failed when any failed).
  std::vector<KvLoadState> load_states;
  KvTransferCounters counters;
  // Blocks the disk tier did not write after all (its queue was full, or the disk refused): the
  // scheduler side forgets them.
  std::vector<KvBlockKey> disk_dropped;

  bool operator==(const KvConnectorOutput&) const = default;
};

}  // namespace pagoda
