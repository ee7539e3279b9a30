// Executor: how the engine runs a step on its workers (vLLM v1's Executor). The engine core, on
// the scheduler's rank, registers requests, hands over each SchedulerOutput and gets the sampled
// tokens back; the executor turns the step into a StepMessage (step_message.h) and has its
// workers run it: in this process (LocalExecutor), or on other ranks through a Communicator
// (comm/communicator.h). Nothing above this interface knows which.
//
// Engine thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "worker/step_message.h"
#include "worker/worker.h"

namespace pagoda {

class Executor {
 public:
  virtual ~Executor() = default;

  // The model as the scheduler sees it (the whole model, whatever its shards), and the draft
  // model's (null without one).
  virtual const ModelConfig& config() const = 0;
  virtual const ModelConfig* draft_config() const { return nullptr; }

  // What a worker holds and needs, for sizing the KV cache (worker.h); rank 0's worker answers
  // for the group. An executor of a replica whose workers all run elsewhere cannot profile: it is
  // sized as the replica it copies.
  virtual Result<WorkerMemory> memory(int64_t block_size, KvCacheDtype dtype, int64_t max_num_batched_tokens,
                                      int64_t max_num_seqs) const = 0;
  // Allocates every worker's KV cache and makes its proposer (vLLM's initialize_from_config), once
  // before the first step: one path for one process and for every rank of a group. Fails when a
  // worker cannot (its message names the rank).
  virtual Status initialize(const WorkerInit& init) = 0;
  // Ranks of the tensor-parallel group the steps run on (each holds a shard of every KV block).
  virtual int tensor_parallel_size() const { return 1; }
  // The proposer's description, when the workers speculate ("" otherwise, or not known here).
  virtual std::string proposer_description() const { return ""; }

  // Registers a request's sampling parameters (copied), generator seed, the ids masked before
  // params.min_tokens and its cache salt; the workers get them with its first scheduled step.
  // `skip_draws`: draws its generator has made elsewhere (a first token a prefill instance sampled).
  void add_request(RequestId id, const SamplingParams& params, uint64_t seed, std::vector<TokenId> min_tokens_suppressed,
                   std::string cache_salt = "", int64_t skip_draws = 0);
  // The request ended; the workers forget it with the next step.
  void remove_request(RequestId id);
  // A step that scheduled nothing preempted these; the workers hear of it with the next step.
  void preempted(std::span<const RequestId> ids) { encoder_.preempt(ids); }
  // Whether ended or preempted requests are still to be named to the workers.
  bool has_notices() const { return encoder_.has_notices(); }

  // Runs one step on the workers. An error means the workers failed (a rank died, a message was
  // refused): the engine cannot go on.
  Result<ModelRunnerOutput> execute(const SchedulerOutput& scheduled);

  // Steps that may be in flight at once: 1, or the pipeline's stages (vLLM's batch queue). The
  // engine submits steps while fewer are in flight and collects their outputs in order.
  virtual int max_in_flight() const { return 1; }
  // Starts a step (its message is encoded now, after every earlier one); collect() returns the
  // oldest submitted step's output. Errors as for execute().
  Status submit(const SchedulerOutput& scheduled);
  Result<ModelRunnerOutput> collect();

 protected:
  virtual Result<ModelRunnerOutput> execute_step(const StepMessage& message) = 0;
  // Executors that run steps concurrently override both; by default a step runs at submit and
  // its output waits for collect.
  virtual Status submit_step(const StepMessage& message);
  virtual Result<ModelRunnerOutput> collect_step();

 private:
  StepEncoder encoder_;
  std::deque<Result<ModelRunnerOutput>> done_;  // the default submit_step's outputs
};

// One worker in this process (vLLM's UniProcExecutor). With `through_bytes`, each message and
// output goes through its byte encoding, as between processes (for tests of the encoding on real
// runs); otherwise the message is handed over as it is.
class LocalExecutor final : public Executor {
 public:
  // `max_in_flight` > 1 (tests): the engine keeps that many steps in flight, as under pipeline
  // parallelism, though each runs when it is submitted.
  explicit LocalExecutor(std::unique_ptr<Worker> worker, bool through_bytes = false, int max_in_flight = 1);

  const ModelConfig& config() const override { return worker_->config(); }
  const ModelConfig* draft_config() const override { return worker_->draft_config(); }
  Result<WorkerMemory> memory(int64_t block_size, KvCacheDtype dtype, int64_t max_num_batched_tokens,
                              int64_t max_num_seqs) const override {
    return worker_->memory(block_size, dtype, max_num_batched_tokens, max_num_seqs);
  }
  Status initialize(const WorkerInit& init) override;
  std::string proposer_description() const override;
  int max_in_flight() const override { return max_in_flight_; }
  const Worker& worker() const { return *worker_; }

 protected:
  Result<ModelRunnerOutput> execute_step(const StepMessage& message) override;

 private:
  std::unique_ptr<Worker> worker_;
  bool through_bytes_;
  int max_in_flight_;
};

}  // namespace pagoda
