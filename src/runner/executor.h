// Executor: how the engine runs a step on its workers (vLLM v1's Executor). The engine core, on
// the scheduler's rank, registers requests, hands over each SchedulerOutput and gets the sampled
// tokens back; the executor turns the step into a StepMessage (step_message.h) and has its
// workers run it: in this process (LocalExecutor), or on other ranks through a Communicator
// (backend/communicator.h). Nothing above this interface knows which.
//
// Engine thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "base/status.h"
#include "runner/model_runner.h"
#include "runner/step_message.h"
#include "runner/worker.h"

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

  // Runs one step on the workers. An error means the workers failed (a rank died, a message was
  // refused): the engine cannot go on.
  Result<ModelRunnerOutput> execute(const SchedulerOutput& scheduled);

 protected:
  virtual Result<ModelRunnerOutput> execute_step(const StepMessage& message) = 0;

 private:
  StepEncoder encoder_;
};

// One worker in this process (vLLM's UniProcExecutor). With `through_bytes`, each message and
// output goes through its byte encoding, as between processes (for tests of the encoding on real
// runs); otherwise the message is handed over as it is.
class LocalExecutor final : public Executor {
 public:
  explicit LocalExecutor(std::unique_ptr<ModelRunner> runner, bool through_bytes = false);

  const ModelConfig& config() const override { return worker_.config(); }

 protected:
  Result<ModelRunnerOutput> execute_step(const StepMessage& message) override;

 private:
  Worker worker_;
  bool through_bytes_;
};

}  // namespace pagoda
