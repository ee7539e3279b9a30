// The KV connector seam (vLLM v1's KVConnectorBase_V1): a way for KV blocks to enter and leave
// the paged KV cache other than by computing them. It has two halves:
//
//   KvConnectorScheduler, beside the Scheduler (engine thread): says how many tokens of a request
//   beyond its prefix-cache hit the connector can supply, is told which blocks they go to, notes
//   which computed blocks to save, and each step hands the workers a KvConnectorMetadata;
//   KvConnectorWorker, in each Worker (every rank): moves block contents as the metadata says,
//   before and after the step's forward pass, and reports the loads in flight.
//
// A request whose tokens are being loaded waits outside the running batch (the scheduler computes
// none of its tokens and schedules everyone else as usual) until every rank reports its load done;
// if any rank reports it failed, the request computes those tokens itself. Loads land in blocks
// the request owns but has not published to the prefix cache, so nothing reads them early.
// Engine (or worker) thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "kv_transfer/kv_connector_metadata.h"
#include "kv_transfer/kv_transfer_params.h"

namespace pagoda {

class KvCacheTensors;
class Kernels;

// What the scheduler side has seen so far (totals), for the metrics.
struct KvConnectorStats {
  int64_t queries = 0;          // tokens looked up beyond the prefix cache's hit
  int64_t hits = 0;             // of those, found in a tier and loaded
  int64_t disk_hits = 0;        // of the hits, found only on disk
  int64_t failed_loads = 0;     // loads that failed (the request computed the tokens)
  int64_t remote_queries = 0;   // prompt tokens asked of prefill instances
  int64_t remote_hits = 0;      // of those, received
  int64_t host_blocks = 0;      // blocks held in the host tier now
  int64_t host_capacity = 0;    // its slots
  int64_t disk_blocks = 0;      // files in the disk tier's index now
  int64_t disk_capacity = 0;
  int64_t requests_waiting = 0;  // requests whose load is in flight now
  KvTransferCounters moved;     // the workers' moves so far (rank 0's shard)
};

// A request as the scheduler side sees it: a view into the scheduler's Request, valid for the call.
struct KvRequest {
  RequestId id = 0;
  std::span<const TokenId> tokens;  // prompt, then output so far
  std::string_view cache_salt;
  bool use_prefix_cache = true;
  const KvTransferParams* kv_transfer = nullptr;  // its kv_transfer_params, when it has some

  int64_t num_tokens() const { return static_cast<int64_t>(tokens.size()); }
};

class KvConnectorScheduler {
 public:
  virtual ~KvConnectorScheduler() = default;

  // Tokens of `request` after its first `num_local_computed` (the prefix cache's hit, whole
  // blocks) that the connector can load, in whole blocks, never reaching its last token (whose
  // logits are computed). 0 when none.
  virtual int64_t get_num_new_matched_tokens(const KvRequest& request, int64_t num_local_computed) = 0;
  // The request now owns `blocks` (its whole table), covering num_local_computed + num_external
  // tokens (num_external from get_num_new_matched_tokens): the connector loads the external ones
  // (the next build_meta starts it) and the request waits until update_connector_output says so.
  virtual void update_state_after_alloc(const KvRequest& request, std::span<const BlockId> blocks,
                                        int64_t num_local_computed, int64_t num_external) = 0;
  // `request` is scheduled this step; once it runs, its first `num_computed_after` tokens have
  // KV in `blocks` (its table). The connector may save the full blocks among them.
  virtual void on_scheduled(const KvRequest& request, int64_t num_computed_after, std::span<const BlockId> blocks) = 0;
  // The step's moves (once per step, after scheduling).
  virtual KvConnectorMetadata build_meta() = 0;
  // The workers' report for the step that carried `meta`: the requests whose load finished, into
  // `done`, and those whose load failed, into `failed` (in `meta.awaiting` order).
  virtual void update_connector_output(const KvConnectorMetadata& meta, const KvConnectorOutput& output,
                                       std::vector<RequestId>& done, std::vector<RequestId>& failed) = 0;
  // The request ended or was preempted (its blocks are freed now): a load in flight is cancelled
  // (the next build_meta tells the workers) and anything kept for it is dropped.
  virtual void request_finished(const KvRequest& request) = 0;

  virtual KvConnectorStats stats() const = 0;
};

class KvConnectorWorker {
 public:
  virtual ~KvConnectorWorker() = default;

  // The KV cache it moves blocks in and out of, and the kernels of its device (the copies go
  // through them). Once, before the first step.
  virtual Status register_kv_caches(const KvCacheTensors& kv, const Kernels& kernels) = 0;
  // Before the step's forward pass: drops cancelled loads, starts new ones, and copies into the
  // device what has arrived. `idle`: the step computes nothing, so a short wait for a load in
  // flight costs nobody anything (and keeps an idle engine from spinning).
  virtual void start_step(const KvConnectorMetadata& meta, bool idle) = 0;
  // After the forward pass: the stores; then the report on meta.awaiting and the step's counters.
  virtual KvConnectorOutput finish_step(const KvConnectorMetadata& meta) = 0;
};

}  // namespace pagoda
