// Worker: one rank's side of an engine step (vLLM v1's Worker). It holds the model (or this rank's
// shard of it) and, when the engine speculates with a draft model, the whole draft model; it sizes
// its needs for the executor (memory), allocates the KV caches and makes its proposer when rank 0
// says how (initialize), and then runs every step: keeps each request it has been sent (its tokens,
// block table, sampling parameters and generator), applies each
// StepMessage's deltas to them, runs the step on its ModelRunner, and drafts the next step's
// tokens with its proposer (vLLM's propose_draft_token_ids), so speculation runs wherever the
// model does: on every rank of a tensor-parallel group and in every data-parallel replica.
//
// A message may come from another process, so it is checked against the worker's state before
// anything runs: a step out of order, an unknown or repeated request id, a token or block id out of
// range, or tokens the block table does not cover is an error naming the problem (the engine then
// fails), never an out-of-bounds access. After an error the worker's state is unspecified.
//
// Engine (or worker) thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv_transfer/kv_connector.h"
#include "speculative/proposer.h"
#include "worker/model_runner.h"
#include "worker/step_message.h"

namespace pagoda {

// What a worker holds and needs, for sizing the KV cache (vLLM's determine_available_memory and
// KV cache spec): every rank's shard is alike, so rank 0's worker answers for its group.
struct WorkerMemory {
  int64_t block_bytes = 0;        // one block of the model's KV cache, over this worker's layers and heads
  int64_t draft_block_bytes = 0;  // one block of the draft model's (0 without one)
  int64_t weight_bytes = 0;       // the model's and the draft's weights
  int64_t activation_bytes = 0;   // a full step's working memory at the scheduler's limits, both models
};

// Where a worker sits in its tensor-parallel group (its KV connector keeps the ranks' files apart).
struct WorkerRank {
  int rank = 0;
  int size = 1;
};

class Worker {
 public:
  // `draft`: the draft model, when the engine speculates with one.
  explicit Worker(std::unique_ptr<Model> model, std::unique_ptr<Model> draft = nullptr, WorkerRank rank = {});

  // The whole model's config, and the draft's (null without one).
  const ModelConfig& config() const { return runner_->config(); }
  const ModelConfig* draft_config() const;

  // Its memory for a KV cache of `block_size`-token blocks in `dtype` and steps of up to
  // `max_num_batched_tokens` tokens and `max_num_seqs` sequences.
  WorkerMemory memory(int64_t block_size, KvCacheDtype dtype, int64_t max_num_batched_tokens,
                      int64_t max_num_seqs) const;

  // Allocates the KV caches (the draft's too), makes the proposer and starts the KV connector's
  // worker side (init.kv_connector). Once, before any step; fails when the memory cannot be had,
  // the draft model is missing or the connector cannot start (its disk tier's directory).
  Status initialize(const WorkerInit& init);

  // Applies `message` (finished, preempted, new requests, then the scheduled deltas), runs the
  // step between its KV connector's moves (kv_transfer/kv_connector.h), then proposes each
  // scheduled request's drafts. Errors leave the step unrun.
  Result<ModelRunnerOutput> execute(const StepMessage& message);

  // Requests held (sent and not yet finished); for tests.
  size_t num_requests() const { return requests_.size(); }
  // The proposer (null when the engine does not speculate); for tests and the start-up log.
  const Proposer* proposer() const { return proposer_.get(); }

 private:
  struct RequestState {
    std::vector<TokenId> all_tokens;  // prompt, then output
    size_t num_prompt_tokens = 0;
    std::vector<BlockId> block_table;
    std::string cache_salt;
    SamplingState sampling;
  };
  // Checks one scheduled delta against the request and applies it.
  Status apply(const ScheduledRequestData& d, RequestState& r) const;
  // Drafts for the next step of every request of `scheduled`, into out.drafts.
  void propose(const SchedulerOutput& scheduled, ModelRunnerOutput& out);

  std::unique_ptr<ModelRunner> runner_;
  std::unique_ptr<Model> draft_;        // until initialize() hands it to the proposer
  std::unique_ptr<Proposer> proposer_;
  std::unique_ptr<KvConnectorWorker> connector_;  // null without --kv-transfer-config
  WorkerRank rank_;
  WorkerInit init_;
  bool initialized_ = false;
  std::unordered_map<RequestId, RequestState> requests_;
  uint64_t last_step_ = 0;
};

}  // namespace pagoda
