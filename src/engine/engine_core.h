// EngineCore: the continuous-batching loop body, single-threaded: schedule -> execute ->
// update -> process outputs. Owns the scheduler, the executor (its workers own the model and the
// KV cache memory) and the per-sequence output processing; borrows the tokenizer. Engine
// (engine.h) runs it on its own thread; LLM (llm.h) drives it directly. Not thread-safe.
//
// KV cache size: config.kv_cache_memory bytes; else, with config.gpu_memory_utilization F, what
// is left of F x the machine's memory (physical, or the cgroup's limit) after the model's
// weights and the activations of a full step (vLLM's rule, the machine's memory standing in for
// the GPU's); else a quarter of the memory available at start-up, but never more than
// max_num_seqs full-length sequences need.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/engine_types.h"
#include "engine/output_processor.h"
#include "engine/request_validation.h"
#include "metrics/engine_metrics.h"
#include "executor/executor.h"
#include "scheduler/scheduler.h"
#include "tokenizer/tokenizer.h"

namespace pagoda {

// Speculative decoding so far (vLLM's spec_decode counters): drafts verified, their tokens, the
// tokens accepted, and per draft position how often it (and so every one before it) was accepted.
struct SpecDecodeStats {
  int64_t num_drafts = 0;         // verification steps of one request with at least one draft
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> num_accepted_per_pos;
};

class EngineCore {
 public:
  // Checks the configuration against the executor's model (EngineConfig::validate), sizes the KV
  // cache from what the workers hold and need (engine/kv_cache_sizing.h), has every worker
  // allocate it (Executor::initialize) and builds the scheduler. Fails on bad limits or when not
  // even one full-length sequence fits in the KV cache memory. With config.speculative.method
  // "draft_model", the workers hold the draft (same vocabulary size, a context at least
  // --max-model-len long, or the error names the problem); its KV cache comes out of the same
  // memory, with 9 blocks for every 8 of the target's (room for drafts beyond the tokens).
  static Result<std::unique_ptr<EngineCore>> create(std::unique_ptr<Executor> executor,
                                                    std::shared_ptr<const Tokenizer> tokenizer,
                                                    const EngineConfig& config);
  // The same in one process: a LocalExecutor over a Worker of `model` (and `draft_model`).
  static Result<std::unique_ptr<EngineCore>> create(std::unique_ptr<Model> model,
                                                    std::shared_ptr<const Tokenizer> tokenizer,
                                                    const EngineConfig& config,
                                                    std::unique_ptr<Model> draft_model = nullptr);

  // Another data-parallel replica of `like` (an engine created above): its configuration, KV cache
  // size and tokenizer, with its own scheduler, running its steps on `executor` (whose workers
  // hold the model, and the draft model when there is one), started as like's were.
  static Result<std::unique_ptr<EngineCore>> create_replica(const EngineCore& like, std::unique_ptr<Executor> executor);

  // Checks a request without adding it (thread-safe: reads only immutable state): tokenizes if
  // needed (filling prompt_token_ids) and validates parameters and lengths. The message names
  // the bad parameter.
  Status prepare(GenerateRequest& request) const;
  // The bounds prepare() checks a request against (validate_request in request_validation.h).
  RequestLimits request_limits() const;

  // Adds a prepared request under `id` (its n sequences run as separate scheduler requests that
  // share the prompt's cached blocks).
  Status add_request(RequestId id, const GenerateRequest& request);

  // Ends every sequence of request `id` with `reason` (abort, or error when the engine failed);
  // returns their final chunks.
  std::vector<OutputChunk> abort(RequestId id, FinishReason reason = FinishReason::kAbort);

  // One engine step; returns the output chunks it produced. on_scheduled, when set, runs once the
  // scheduler has decided the step (stats() then counts the requests that stay waiting), before
  // the forward pass. Throws std::runtime_error naming the problem when the executor fails (a
  // worker died or refused the step): the core cannot go on.
  std::vector<OutputChunk> step(const std::function<void()>& on_scheduled = {});

  // Records vLLM's engine metrics from now on (per step, per token, per finished sequence), as
  // data-parallel engine `engine` of `metrics`.
  void set_metrics(std::shared_ptr<metrics::EngineMetrics> metrics, int engine = 0) {
    metrics_ = std::move(metrics);
    metrics_engine_ = engine;
  }

  // Requests to run, steps in flight whose output is still to be taken, or ended requests the
  // workers are still to hear of (the next step, even of nothing, tells them).
  bool has_unfinished() const {
    return scheduler_->has_unfinished() || !in_flight_.empty() || executor_->has_notices();
  }
  // Steps submitted whose output step() has not taken yet.
  int64_t num_steps_in_flight() const { return static_cast<int64_t>(in_flight_.size()); }
  SchedulerStats stats() const { return scheduler_->stats(); }
  const SpecDecodeStats& spec_stats() const { return spec_stats_; }
  const ModelConfig& model_config() const { return executor_->config(); }
  const EngineConfig& config() const { return config_; }
  int64_t num_blocks() const { return init_.num_blocks; }
  // The target's KV cache (the draft model's, when there is one, comes on top).
  int64_t kv_cache_bytes() const { return init_.num_blocks * memory_.block_bytes; }
  // The executor (its workers hold the model, the KV cache and the proposer); for tests.
  const Executor& executor() const { return *executor_; }
  // "KV cache: N blocks of B tokens (X bytes each), up to T tokens at once; sized by ..."
  std::string kv_cache_summary() const;
  // "Speculative decoding: ngram, up to K draft tokens per step, ..." (or "draft model PATH,
  // ..."); "" when off.
  std::string speculative_summary() const;

 private:
  EngineCore() = default;
  struct Sequence {
    RequestId parent = 0;
    int64_t index = 0;
    int64_t prompt_tokens = 0;
    std::unique_ptr<SequenceOutput> output;
    bool want_logprobs = false;
    bool want_prompt_logprobs = false;
    int64_t num_output_tokens = 0;
    int64_t num_cached_tokens = 0;
    std::vector<SampledOutput> pending_prompt_logprobs;  // until the first chunk carries them
    int64_t next_prompt_logprob = 1;  // the prompt position whose logprobs come next
    std::chrono::steady_clock::time_point arrival;
    double queued_s = -1;
    double first_token_s = -1;
    std::chrono::steady_clock::time_point last_token;  // for the inter-token latency
  };
  double since(const Sequence& s) const;
  OutputChunk finish_chunk(RequestId seq_id, Sequence& s, FinishReason reason, TokenId stop_token);

  void record_finished(const OutputChunk& last);
  // With nothing left to run, tells the workers of the requests that ended since the last step.
  void tell_workers_if_idle();
  void record_step(int64_t scheduled_tokens);

  EngineConfig config_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  std::shared_ptr<metrics::EngineMetrics> metrics_;  // may be null
  int metrics_engine_ = 0;                           // this core's engine index in metrics_
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Scheduler> scheduler_;
  SpecDecodeStats spec_stats_;
  WorkerInit init_;              // what every worker was started with (the KV cache, the proposer)
  WorkerMemory memory_;          // what a worker holds and needs
  int64_t f32_block_bytes_ = 0;  // a float32 block's bytes, for kv_cache_summary()
  std::string kv_sizing_;        // how the KV cache size was chosen, for kv_cache_summary()
  std::string speculation_;      // the workers' proposer, for speculative_summary()
  RequestId next_seq_id_ = 1;
  uint64_t next_arrival_ = 0;
  std::unordered_map<RequestId, Sequence> seqs_;                 // by scheduler id
  std::unordered_map<RequestId, std::vector<RequestId>> children_;  // request id -> seq ids
  // Steps submitted and not yet collected, oldest first (more than one under pipeline
  // parallelism); their token views may outlive a request aborted meanwhile, so only their ids
  // are read once the step is collected.
  std::deque<SchedulerOutput> in_flight_;
};

// Parses a byte size such as "4GiB", "512MiB", "1.5GB", "1000000" (errors name the text).
Result<int64_t> parse_byte_size(const std::string& text);

}  // namespace pagoda
