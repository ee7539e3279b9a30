// EngineCore: the continuous-batching loop body (vLLM v1's EngineCore): schedule -> execute on the
// executor's workers -> update the scheduler. It owns the scheduler and the executor (whose
// workers own the model, the KV cache memory and the proposer) and knows nothing of text: each
// sequence comes in as a CoreRequest (the output processor fans a request's n sequences out), and
// each step's tokens go back as a CoreStepOutput for the output processor, which decides which
// sequences stopped and has them finished (finish_requests) before the next step. LLMEngine
// (llm_engine.h) puts the two together. Single-threaded: not thread-safe.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine_types.h"
#include "executor/executor.h"
#include "engine/structured_outputs.h"
#include "scheduler/scheduler.h"

namespace pagoda {

// Speculative decoding so far (vLLM's spec_decode counters): drafts verified, their tokens, the
// tokens accepted, and per draft position how often it (and so every one before it) was accepted.
struct SpecDecodeStats {
  int64_t num_drafts = 0;         // verification steps of one request with at least one draft
  int64_t num_draft_tokens = 0;
  int64_t num_accepted_tokens = 0;
  std::vector<int64_t> num_accepted_per_pos;
};

// One sequence as the core runs it (vLLM's EngineCoreRequest).
struct CoreRequest {
  RequestId id = 0;                             // the sequence's own id
  std::vector<TokenId> prompt_token_ids;
  SamplingParams params;
  uint64_t seed = 0;                            // its generator's seed
  std::vector<TokenId> min_tokens_suppressed;   // masked while fewer than params.min_tokens are out
  int64_t priority = 0;
  std::string cache_salt;
  bool use_prefix_cache = true;                 // off when every prompt row must be computed
  std::optional<GrammarConstraint> constraint;  // its tokens follow a grammar
  bool starts_text = false;                     // no prompt text before the output (the
                                                // tokenizer's leading-space rule applies to it)
  std::optional<KvTransferParams> kv_transfer;  // disaggregated prefill
};

// What one core step produced (vLLM's EngineCoreOutputs): the tokens of the step it collected,
// and when it scheduled the sequences of the step it submitted.
struct CoreStepOutput {
  std::vector<RequestUpdate> updates;                // per sequence with new tokens, in batch order
  std::vector<PromptLogprobsOutput> prompt_logprobs;
  std::vector<SpecDecodeCounts> spec;                // drafts verified, per sequence
  int64_t num_scheduled_tokens = 0;                  // of the collected step (0: none collected)
  std::vector<RequestId> scheduled;                  // sequences in the step submitted now
  std::chrono::steady_clock::time_point scheduled_at;
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
  static Result<std::unique_ptr<EngineCore>> create(std::unique_ptr<Executor> executor, const EngineConfig& config);

  // Another data-parallel replica of `like` (an engine created above): its configuration and KV
  // cache size, with its own scheduler, running its steps on `executor` (whose workers hold the
  // model, and the draft model when there is one), started as like's were.
  static Result<std::unique_ptr<EngineCore>> create_replica(const EngineCore& like, std::unique_ptr<Executor> executor);

  // Adds one sequence (a fresh id). Fails, keeping nothing, when it can never run (scheduler.h).
  Status add_request(CoreRequest request);  // its prompt moves into the scheduler's Request

  // Ends these sequences wherever they are (running, waiting, or in a step in flight, whose
  // tokens for them are then dropped), freeing their KV blocks now; with nothing left to run,
  // tells the workers at once (a step of nothing).
  void finish_requests(std::span<const RequestId> ids);

  // One engine step. on_scheduled, when set, runs once the scheduler has decided the step
  // (stats() then counts the requests that stay waiting), before the forward pass. Throws
  // std::runtime_error naming the problem when the executor fails (a worker died or refused the
  // step): the core cannot go on.
  CoreStepOutput step(const std::function<void()>& on_scheduled = {});

  // Sequences to run, steps in flight whose output is still to be taken, or ended sequences the
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
  // "KV offloading: a host tier of N blocks (X GiB)..." ("" without a KV connector).
  const std::string& connector_summary() const { return connector_summary_; }
  // The KV connector's totals (null without one).
  std::optional<KvConnectorStats> connector_stats() const {
    if (!scheduler_->connector()) return std::nullopt;
    return scheduler_->connector()->stats();
  }

 private:
  EngineCore() = default;
  // With nothing left to run, tells the workers of the sequences that ended since the last step.
  void tell_workers_if_idle();

  EngineConfig config_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Scheduler> scheduler_;
  SpecDecodeStats spec_stats_;
  WorkerInit init_;              // what every worker was started with (the KV cache, the proposer)
  WorkerMemory memory_;          // what a worker holds and needs
  int64_t f32_block_bytes_ = 0;  // a float32 block's bytes, for kv_cache_summary()
  std::string kv_sizing_;        // how the KV cache size was chosen, for kv_cache_summary()
  std::string speculation_;      // the workers' proposer, for speculative_summary()
  std::string connector_summary_;
  uint64_t next_arrival_ = 0;
  // Steps submitted and not yet collected, oldest first (more than one under pipeline
  // parallelism); their token views may outlive a request finished meanwhile, so only their ids
  // are read once the step is collected.
  std::deque<SchedulerOutput> in_flight_;
  std::unique_ptr<StructuredOutputs> structured_;  // the grammar masks of constrained sequences
};

// Parses a byte size such as "4GiB", "512MiB", "1.5GB", "1000000" (errors name the text).
Result<int64_t> parse_byte_size(const std::string& text);

}  // namespace pagoda
