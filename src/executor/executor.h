// Executor: how the engine runs a step on its workers (vLLM v1's Executor). The engine core, on
// the scheduler's rank, registers requests, hands over each SchedulerOutput and gets the sampled
// tokens back; the executor turns the step into a StepMessage (step_message.h) and has its
// workers run it: in this process (LocalExecutor), or on other ranks through a Communicator
// (backend/communicator.h). Nothing above this interface knows which.
//
// Engine thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "base/status.h"
#include "worker/model_runner.h"
#include "worker/step_message.h"
#include "worker/worker.h"

namespace pagoda {

class Executor {
 public:
  virtual ~Executor() = default;

  // The model as the scheduler sees it (the whole model, whatever its shards).
  virtual const ModelConfig& config() const = 0;

  // Registers a request's sampling parameters (copied), generator seed and the ids masked before
  // params.min_tokens; the workers get them with its first scheduled step.
  void add_request(RequestId id, const SamplingParams& params, uint64_t seed, std::vector<TokenId> min_tokens_suppressed);
  // The request ended; the workers forget it with the next step.
  void remove_request(RequestId id);
  // A step that scheduled nothing preempted these; the workers hear of it with the next step.
  void preempted(std::span<const RequestId> ids) { encoder_.preempt(ids); }

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
  explicit LocalExecutor(std::unique_ptr<ModelRunner> runner, bool through_bytes = false, int max_in_flight = 1);

  const ModelConfig& config() const override { return worker_.config(); }
  int max_in_flight() const override { return max_in_flight_; }

 protected:
  Result<ModelRunnerOutput> execute_step(const StepMessage& message) override;

 private:
  Worker worker_;
  bool through_bytes_;
  int max_in_flight_;
};

}  // namespace pagoda
