// The engine's public vocabulary: what a caller submits (GenerateRequest), how the engine is
// configured (EngineConfig), and what streams back (OutputChunk). Plain structs.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "base/types.h"
#include "base/status.h"
#include "kv_transfer/kv_transfer_config.h"
#include "sample/sampler.h"
#include "scheduler/request.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_output.h"
#include "speculative/speculative_config.h"
#include "structured/token_grammar.h"
#include "tensor/kv_cache_dtype.h"

namespace pagoda {

struct EngineConfig {
  SchedulerConfig scheduler;            // max_model_len 0 = the model's context length
  int32_t block_size = 16;              // 1..256
  int64_t kv_cache_memory = 0;          // bytes; 0 = from gpu_memory_utilization or the default
  double gpu_memory_utilization = 0;    // (0, 1]: fraction of the machine's memory; 0 = not set
  bool enable_prefix_caching = true;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kF32;  // --kv-cache-dtype (auto: f32)
  uint64_t seed = 0;                    // seeds requests that give no seed of their own
  int64_t max_logprobs = SamplingParams::kMaxLogprobs;  // most logprobs / prompt_logprobs a request may ask for
  SpeculativeConfig speculative;
  // Tests: the in-process executor passes every step through its byte encoding, as the
  // multi-process executors do (worker/step_message.h).
  bool serialize_steps = false;
  // Tests: the in-process executor lets the engine keep this many steps in flight, as a pipeline
  // of that many stages does (each step still runs when it is submitted).
  int steps_in_flight = 1;
  // Data parallelism: the engines of this host that share its memory (the replicas here), each
  // taking its share of the automatic KV-cache budgets (--gpu-memory-utilization, the default).
  int replicas_on_host = 1;
  // --kv-transfer-config / --kv-offloading-size: the KV connector (none by default).
  KvTransferConfig kv_transfer;
  // The loaded weights' fingerprint (kv_transfer/offloading_connector.h's weights_fingerprint):
  // what the disk tier's files must have been written for. Zero when unknown (the disk tier is
  // then refused).
  Sha256Digest model_fingerprint{};

  // The one check of an engine's configuration: fails naming the flag of the first bad or
  // contradictory setting, and fills in vLLM's defaults (ngram's lookup lengths). Without a
  // model (the flags, before anything loads) it checks what needs none; with the model it runs
  // (and the draft model, null unless speculative.method is draft_model) it also fills in what is
  // left to the model (max_model_len 0 = its context length) and checks against it.
  Status validate(const ModelConfig* model = nullptr, const ModelConfig* draft = nullptr);
};

// Request defaults from a model folder's generation_config.json (vLLM's --generation-config
// auto): they replace the engine's own defaults for the fields a request leaves out, and
// max_new_tokens also caps every request's max_tokens, as in vLLM.
struct GenerationDefaults {
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k, max_new_tokens;

  // Sets the fields of `p` that these defaults hold (not max_tokens: see max_new_tokens).
  void apply_to(SamplingParams& p) const {
    if (temperature) p.temperature = *temperature;
    if (top_p) p.top_p = *top_p;
    if (min_p) p.min_p = *min_p;
    if (repetition_penalty) p.repetition_penalty = *repetition_penalty;
    if (top_k) p.top_k = *top_k;
  }
  bool empty() const {
    return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_new_tokens;
  }
};

// A structured output's constraint, compiled by the frontend against the model's vocabulary
// (structured/token_grammar.h): every output token is one the grammar allows.
struct GrammarConstraint {
  std::shared_ptr<const structured::TokenGrammar> grammar;
  // When set, the constraint starts after the output's first such token (a reasoning model's
  // end of thinking, with thinking on).
  std::optional<TokenId> after_token;
};

struct GenerateRequest {
  std::string prompt;                   // tokenized when prompt_token_ids is empty
  std::vector<TokenId> prompt_token_ids;
  bool add_special_tokens = true;
  SamplingParams params;
  int64_t priority = 0;
  std::string cache_salt;
  std::optional<GrammarConstraint> constraint;
  // Disaggregated prefill (kv_transfer/kv_transfer_params.h); n must be 1 with them.
  std::optional<KvTransferParams> kv_transfer;
};

struct RequestTimings {
  double queued_s = 0;       // arrival -> first scheduled
  double first_token_s = 0;  // arrival -> first output token
  double finished_s = 0;     // arrival -> finished
};

// One piece of one sequence's output. The last chunk of a sequence has finish_reason set and
// carries the usage and timings.
struct OutputChunk {
  RequestId request_id = 0;
  int64_t index = 0;                     // which of the request's n sequences
  std::string text;                      // new text (complete UTF-8)
  std::vector<TokenId> token_ids;        // new tokens
  std::vector<SampledOutput> logprobs;   // parallel to token_ids when params.logprobs is set
  std::vector<SampledOutput> prompt_logprobs;  // first chunk only, when asked; entry i is for
                                               // prompt token i + 1
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;               // the stop string that ended it, if one did
  TokenId stop_token = -1;               // the stop token id that ended it, if one did
  int64_t prompt_tokens = 0;             // usage, set on the last chunk
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  RequestTimings timings;                // set on the last chunk
  bool finished() const { return finish_reason != FinishReason::kNone; }
};

}  // namespace pagoda
