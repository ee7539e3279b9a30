// The engine flags every serving subcommand accepts alike (generate, bench, and serve later),
// named as vLLM names them, and the JSON request fields of the OpenAI API mapped onto a
// GenerateRequest.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>

#include "base/status.h"
#include "engine/engine_core.h"

namespace CLI {
class App;
}

namespace pagoda::app {

struct EngineFlags {
  int32_t block_size = 16;
  std::string kv_cache_memory;              // "" = default
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t max_model_len = 0;                // 0 = the model's context length
  int64_t long_prefill_token_threshold = 0;
  bool enable_prefix_caching = true;
  std::string scheduling_policy = "fcfs";
  uint64_t seed = 0;

  void add_to(CLI::App& app);
  Result<EngineConfig> to_config() const;
};

// A request from one JSON object with OpenAI field names: "prompt" (string) or
// "prompt_token_ids", plus optional max_tokens, temperature, top_p, top_k, min_p, n,
// presence_penalty, frequency_penalty, repetition_penalty, logit_bias, seed, stop (string or
// list), stop_token_ids, ignore_eos, min_tokens, include_stop_str_in_output, logprobs,
// prompt_logprobs, skip_special_tokens, priority, cache_salt. Unknown fields are rejected, as are
// fields of the wrong type; the message names the field.
Result<GenerateRequest> request_from_json(const nlohmann::json& j);

}  // namespace pagoda::app
