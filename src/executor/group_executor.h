// The executor of a model sharded over a group of ranks (tensor parallelism: vLLM's
// MultiprocExecutor and its workers' busy loop). Rank 0 holds the scheduler and a GroupExecutor;
// every other rank runs run_group_worker. Each step's StepMessage goes to every rank by one
// broadcast, every rank's Worker runs it on its shard (the forward pass's all-reduces keep the
// ranks in step, and every rank gets the whole logits and samples the same tokens), and rank 0's
// output is the step's.
//
// On the wire (broadcast_bytes from rank 0), one kind byte then the body:
//   'K' the workers' start (worker/step_message.h's WorkerInit: the KV cache to allocate, how to
//       draft), sent once, before any step;
//   'S' a step: serialize_step's bytes;
//   'Q' stop: rank 0 is shutting down.
//
// Starting a group, every rank calls agree_to_start with its own outcome (the shard it loaded,
// then its start: the KV cache it allocated, its proposer) and a fingerprint of what it loaded: a rank that failed, or loaded
// another model or configuration, fails every rank's start, naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/communicator.h"
#include "comm/send_queue.h"
#include "base/status.h"
#include "executor/executor.h"

namespace pagoda {

// Every rank's `mine`, and its `fingerprint` (equal on every rank that loaded the same thing;
// `what` describes it for the message). Returns the first failure, "rank R: <its error>", or a
// mismatch naming both ranks' descriptions; OK when every rank succeeded alike. Every rank of
// the group must call it, whatever its outcome.
Status agree_to_start(Communicator& comm, const Status& mine, uint64_t fingerprint, const std::string& what);

// Every rank's report on the KV connector's loads in flight (message.kv_connector.awaiting), made
// one (kv_transfer/kv_connector.h): a load is done when every rank has its shard in, failed when
// any rank failed. Every rank of the group calls it after each step; a no-op without loads.
Status agree_on_loads(Communicator& comm, const StepMessage& message, ModelRunnerOutput& out);

// A stable 64-bit hash (FNV-1a) of `text`, for fingerprints.
uint64_t fingerprint_of(const std::string& text);

class GroupExecutor final : public Executor {
 public:
  // Rank 0, taking over its own worker (rank 0's shard); the other ranks wait for initialize().
  GroupExecutor(Communicator& comm, std::unique_ptr<Worker> worker) : comm_(comm), worker_(std::move(worker)) {}
  // Tells the other ranks to stop (when the group still works).
  ~GroupExecutor() override;

  const ModelConfig& config() const override { return worker_->config(); }
  const ModelConfig* draft_config() const override { return worker_->draft_config(); }
  Result<WorkerMemory> memory(int64_t block_size, KvCacheDtype dtype, int64_t max_num_batched_tokens,
                              int64_t max_num_seqs) const override {
    return worker_->memory(block_size, dtype, max_num_batched_tokens, max_num_seqs);
  }
  // Sends every rank the start, starts rank 0's worker, and waits for every rank's.
  Status initialize(const WorkerInit& init) override;
  std::string proposer_description() const override;
  int tensor_parallel_size() const override { return comm_.size(); }

 protected:
  Result<ModelRunnerOutput> execute_step(const StepMessage& message) override;

 private:
  Communicator& comm_;
  std::unique_ptr<Worker> worker_;
  bool failed_ = false;
};

// Pipeline parallelism (--pipeline-parallel-size P > 1, model/tensor_parallel.h): rank 0 holds
// the scheduler and runs stage 0 (with its tensor-parallel peers). Up to P steps are in flight
// (vLLM's batch queue), each stage working on a different one. Every message goes through a
// SendQueue, so that no rank waits for a receiver (send_queue.h says why):
//   rank 0 -> every other rank: 'S' + the step (send_bytes), 'Q' to stop;
//   stage s -> stage s + 1: the activations (the model's forward pass sends them);
//   the last stage's first rank -> rank 0: 'O' + the step's output (serialize_output).
// The KV cache's size and the start's agreement go as for tensor parallelism ('K', above).
//
// Data parallelism: the same executor drives a replica whose ranks all run elsewhere
// (create_remote): rank 0 of `link` (this rank and the replica's) runs no stage, the replica's
// first rank runs stage 0, and every one of its ranks runs run_pipeline_worker, with one stage
// or more.
class PipelineExecutor final : public Executor {
 public:
  // Rank 0 of `world` (every stage's ranks), whose SendQueue is `sender`; `output_rank` sends the
  // outputs; `worker`: stage 0's shard (created with the same sender).
  static std::unique_ptr<PipelineExecutor> create(Communicator& world, SendQueue& sender, int stages, int output_rank,
                                                  std::unique_ptr<Worker> worker);
  // Rank 0 of `link`, driving the replica on its other ranks. `config`: the whole model's.
  static std::unique_ptr<PipelineExecutor> create_remote(Communicator& link, SendQueue& sender, int stages,
                                                         int output_rank, const ModelConfig& config);
  // Tells the other ranks to stop (when the group still works).
  ~PipelineExecutor() override;

  const ModelConfig& config() const override { return config_; }
  const ModelConfig* draft_config() const override { return worker_ ? worker_->draft_config() : nullptr; }
  // A remote replica has no worker here: unimplemented (it is sized as the replica it copies).
  Result<WorkerMemory> memory(int64_t block_size, KvCacheDtype dtype, int64_t max_num_batched_tokens,
                              int64_t max_num_seqs) const override;
  // Sends every rank the start (stage 0's worker here too, when it runs here) and waits for all.
  Status initialize(const WorkerInit& init) override;
  std::string proposer_description() const override;
  int max_in_flight() const override { return stages_; }

 protected:
  Result<ModelRunnerOutput> execute_step(const StepMessage& message) override;
  Status submit_step(const StepMessage& message) override;
  Result<ModelRunnerOutput> collect_step() override;

 private:
  PipelineExecutor(Communicator& world, SendQueue& sender, int stages, int output_rank, const ModelConfig& config,
                   std::unique_ptr<Worker> worker)
      : world_(world),
        sender_(sender),
        stages_(stages),
        output_rank_(output_rank),
        config_(config),
        worker_(std::move(worker)) {}

  Communicator& world_;
  SendQueue& sender_;
  int stages_;
  int output_rank_;
  ModelConfig config_;
  std::unique_ptr<Worker> worker_;  // stage 0's shard; null for a remote replica
  bool started_ = false;            // initialize() has sent the start
  bool failed_ = false;
};

// Rank 0, when it will not create its GroupExecutor after all (the engine could not be built):
// tells the other ranks, waiting for their first message, to stop.
Status stop_group(Communicator& comm);

// Every rank but 0: waits for the start, starts `worker` (this rank's shard, create_model with the
// group, and its draft model if any), then runs each step rank 0 sends on it until rank 0 says
// stop (OK) or the group fails (the error).
Status run_group_worker(Communicator& comm, std::unique_ptr<Worker> worker);

// Every rank but 0 of a pipeline: as run_group_worker, with the steps from rank 0's SendQueue;
// `sends_output`: this rank (the last stage's first) sends each step's output to rank 0.
// `sender`: this rank's SendQueue, which its shard's forward pass sends through as well.
Status run_pipeline_worker(Communicator& world, SendQueue& sender, std::unique_ptr<Worker> worker, bool sends_output);

}  // namespace pagoda
