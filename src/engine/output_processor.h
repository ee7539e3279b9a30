// OutputProcessor: the engine frontend's side of every step (vLLM v1's OutputProcessor). It fans
// each request out into its n sequences for the core (each with its seed), and turns the core's
// token updates into each request's output chunks: incremental detokenization, the one place that
// decides whether a sequence stops (stop ids once min_tokens are out, max_tokens, max_model_len,
// stop strings even when they span tokens; tokens after the stopping one are dropped), the
// sequences' timings and vLLM's per-token and per-request metrics. The sequences it finds stopped
// go back to the core (EngineCore::finish_requests) before the next step. Engine thread only.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/engine_core.h"
#include "engine/engine_types.h"
#include "metrics/engine_metrics.h"
#include "tokenizer/tokenizer.h"

namespace pagoda {

// SequenceOutput: turns one sequence's sampled tokens into text as it streams: incremental
// detokenization that only emits complete UTF-8, and stop strings found even when they span
// tokens. Text that could still turn out to be the start of a stop string is held back until it
// cannot.
class SequenceOutput {
 public:
  // `after_text`: the prompt holds text (not just BOS), so a SentencePiece output keeps its
  // leading space (see IncrementalDetokenizer::continue_text).
  SequenceOutput(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                 bool include_stop_str, bool skip_special, bool after_text);

  // Adds one generated token. Returns true when a stop string matched (the text is then cut
  // at the match, or after it with include_stop_str, and the sequence must end).
  bool push(TokenId id);

  // Text that is safe to show now; call finish() first when the sequence ended.
  std::string take_ready_text();

  // The sequence ended: flush held-back bytes and text (stop strings can no longer complete).
  void finish();

  const std::string& stop_string() const { return matched_stop_; }  // "" when none matched
  const std::string& text() const { return text_; }

 private:
  IncrementalDetokenizer detok_;
  std::vector<std::string> stops_;
  bool include_stop_;
  size_t max_stop_len_ = 0;
  std::string text_;
  size_t emitted_ = 0;
  bool finished_ = false;
  std::string matched_stop_;
};

class OutputProcessor {
 public:
  // `config`: the engine's (validated), for max_model_len and the seed of requests without one.
  OutputProcessor(std::shared_ptr<const Tokenizer> tokenizer, const EngineConfig& config);

  // Records vLLM's metrics from now on, as data-parallel engine `engine` of `metrics`.
  void set_metrics(std::shared_ptr<metrics::EngineMetrics> metrics, int engine = 0) {
    metrics_ = std::move(metrics);
    metrics_engine_ = engine;
  }

  // Request `id` (validated: request_validation.h) as the core's sequences, one per n (sequence i
  // seeded with seed + i, or from the engine's seed and its id), remembered here until they end.
  // Fails for an id already in use.
  Result<std::vector<CoreRequest>> add_request(RequestId id, const GenerateRequest& request);
  // Forgets a request whose sequences the core refused.
  void remove_request(RequestId id);

  struct Processed {
    std::vector<OutputChunk> chunks;
    std::vector<RequestId> finished;  // sequences that stopped, for EngineCore::finish_requests
  };
  // One core step's tokens as output chunks (a sequence's last chunk carries its usage, timings
  // and finish reason), and the sequences that stopped.
  Processed process(CoreStepOutput out);  // taken: its logprobs move into the chunks

  // Ends every open sequence of request `id` with `reason`: their last chunks, and in *seq_ids the
  // sequences for the core to finish.
  std::vector<OutputChunk> abort(RequestId id, FinishReason reason, std::vector<RequestId>* seq_ids);

  // Records a step's scheduler figures (after its stopped sequences were finished).
  void record_step(const SchedulerStats& stats, int64_t scheduled_tokens);
  // The KV connector's totals, once per step with a connector (metrics::KvOffloadTotals).
  void record_kv_connector(const KvConnectorStats& stats);
  // Whether it records metrics (record_step does nothing without).
  bool has_metrics() const { return metrics_ != nullptr; }

  bool has_request(RequestId id) const { return children_.count(id) != 0; }

 private:
  struct Sequence {
    RequestId parent = 0;
    int64_t index = 0;
    int64_t prompt_tokens = 0;
    std::unique_ptr<SequenceOutput> output;
    // What ends it (stop ids count once min_tokens are out: the sampler masks them before).
    std::vector<TokenId> stop_token_ids;
    int64_t min_tokens = 0;
    int64_t max_tokens = 0;
    bool want_logprobs = false;
    bool want_prompt_logprobs = false;
    int64_t num_output_tokens = 0;
    int64_t num_cached_tokens = 0;
    int64_t num_external_tokens = 0;
    std::vector<SampledOutput> pending_prompt_logprobs;  // until the first chunk carries them
    int64_t next_prompt_logprob = 1;  // the prompt position whose logprobs come next
    std::chrono::steady_clock::time_point arrival;
    double queued_s = -1;
    double first_token_s = -1;
    std::chrono::steady_clock::time_point last_token;  // for the inter-token latency
  };
  double since(const Sequence& s) const;
  // The sequence's last chunk (flushes its text; records the finished request's metrics).
  OutputChunk finish_chunk(Sequence& s, FinishReason reason, TokenId stop_token);
  void forget(RequestId seq_id, const Sequence& s);

  std::shared_ptr<const Tokenizer> tokenizer_;
  int64_t max_model_len_ = 0;
  uint64_t seed_ = 0;
  std::shared_ptr<metrics::EngineMetrics> metrics_;  // may be null
  int metrics_engine_ = 0;                           // this engine's index in metrics_
  RequestId next_seq_id_ = 1;
  std::unordered_map<RequestId, Sequence> seqs_;                    // by sequence id
  std::unordered_map<RequestId, std::vector<RequestId>> children_;  // request id -> its open sequences
};

}  // namespace pagoda
