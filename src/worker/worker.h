// Worker: one rank's side of an engine step (vLLM v1's Worker). Keeps every request it has been
// sent (its tokens, block table, and, through its ModelRunner, its sampling parameters and
// generator), applies each StepMessage's deltas to them, and runs the step on its ModelRunner,
// which owns the model (or this rank's shard of it) and the KV cache memory.
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
#include "worker/model_runner.h"
#include "worker/step_message.h"

namespace pagoda {

class Worker {
 public:
  explicit Worker(std::unique_ptr<ModelRunner> runner);

  const ModelConfig& config() const { return runner_->config(); }

  // Applies `message` (finished, preempted, new requests, then the scheduled deltas) and runs
  // the step. Errors leave the step unrun.
  Result<ModelRunnerOutput> execute(const StepMessage& message);

  // Requests held (sent and not yet finished); for tests.
  size_t num_requests() const { return requests_.size(); }

 private:
  struct RequestState {
    std::vector<TokenId> all_tokens;  // prompt, then output
    size_t num_prompt_tokens = 0;
    std::vector<BlockId> block_table;
  };
  // Checks one scheduled delta against the request and applies it.
  Status apply(const ScheduledRequestData& d, RequestState& r) const;

  std::unique_ptr<ModelRunner> runner_;
  std::unordered_map<RequestId, RequestState> requests_;
  uint64_t last_step_ = 0;
};

}  // namespace pagoda
