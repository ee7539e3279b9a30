// LLMEngine: one engine core with the request handling around it, driven by one thread (vLLM v1's
// LLMEngine: the input processing, an EngineCore, the OutputProcessor). prepare() tokenizes and
// validates a request (the one check, request_validation.h), add_request() fans it out into the
// core's sequences, and step() runs a core step and turns its tokens into output chunks, finishing
// in the core the sequences the output processor found stopped. LLM (llm.h) drives one on the
// calling thread; Engine (engine.h) one per data-parallel replica, each on its own thread.
// Single-threaded: not thread-safe (prepare() is: it reads only immutable state).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "engine/engine_core.h"
#include "engine/output_processor.h"
#include "engine/request_validation.h"
#include "tokenizer/tokenizer.h"

namespace pagoda {

class LLMEngine {
 public:
  LLMEngine(std::unique_ptr<EngineCore> core, std::shared_ptr<const Tokenizer> tokenizer);

  // An engine in one process: the core over a LocalExecutor of `model` (and `draft_model`), as
  // EngineCore::create checks and sizes it.
  static Result<std::unique_ptr<LLMEngine>> create(std::unique_ptr<Model> model,
                                                   std::shared_ptr<const Tokenizer> tokenizer,
                                                   const EngineConfig& config,
                                                   std::unique_ptr<Model> draft_model = nullptr);

  // Tokenizes the prompt if needed and checks the request against the engine's limits (the one
  // check, for a request that did not come through a parser that ran it); the message names the
  // bad parameter. Thread-safe.
  Result<PreparedRequest> prepare(GenerateRequest request) const;
  // The bounds prepare() checks a request against.
  RequestLimits request_limits() const;

  // Adds a prepared request under `id` (its n sequences run as separate core requests that share
  // the prompt's cached blocks). Fails, adding nothing, for an id in use or a request that can
  // never run.
  Status add_request(RequestId id, const PreparedRequest& request);

  // Ends every sequence of request `id` with `reason` (abort, or error when the engine failed);
  // returns their final chunks.
  std::vector<OutputChunk> abort(RequestId id, FinishReason reason = FinishReason::kAbort);

  // One engine step; returns the output chunks it produced (on_scheduled: EngineCore::step).
  // Throws std::runtime_error when the core's workers fail.
  std::vector<OutputChunk> step(const std::function<void()>& on_scheduled = {});

  // Records vLLM's engine metrics from now on, as data-parallel engine `engine` of `metrics`.
  void set_metrics(std::shared_ptr<metrics::EngineMetrics> metrics, int engine = 0) {
    output_.set_metrics(std::move(metrics), engine);
  }

  bool has_unfinished() const { return core_->has_unfinished(); }
  int64_t num_steps_in_flight() const { return core_->num_steps_in_flight(); }
  SchedulerStats stats() const { return core_->stats(); }
  EngineCore& core() { return *core_; }
  const EngineCore& core() const { return *core_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  std::unique_ptr<EngineCore> core_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  OutputProcessor output_;
};

}  // namespace pagoda
