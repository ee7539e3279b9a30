// SpeculativeConfig: --speculative-config (vLLM's JSON object): which proposer drafts tokens for
// the target to verify, and its limits. The engine checks it once (validate), and every worker
// makes its own proposer from it (speculative/make_proposer.h): a draft model runs in the worker,
// next to the target's model runner, on every rank. A plain struct.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"

namespace pagoda {

struct ModelConfig;

struct SpeculativeConfig {
  std::string method;                   // "", "ngram" or "draft_model"; "" = no speculation
  int64_t num_speculative_tokens = 0;   // k: drafts per step, 1..128
  int64_t prompt_lookup_min = 0;        // ngram: 0 = vLLM's defaults (both 5; one set: the other
  int64_t prompt_lookup_max = 0;        //   copies it)
  int64_t disable_by_batch_size = 0;    // > 0: no drafts in a step that runs more requests than this
  std::string model;                    // draft_model: the draft's path (loaded by the launcher)
  std::string quantization;             // draft_model: the draft's --quantization ("" = none)

  bool operator==(const SpeculativeConfig&) const = default;
  bool enabled() const { return !method.empty(); }
  bool uses_draft_model() const { return method == "draft_model"; }

  // Fills in ngram's defaults and checks every field; with `target` (the model; null: the flags
  // alone, before anything loads) also the draft model against it (`draft`, null unless method is
  // draft_model) and `max_model_len`, the engine's context limit. The message starts
  // "--speculative-config" and names the field or the mismatch (a draft of another vocabulary,
  // or a shorter context).
  Status validate(const ModelConfig* target, const ModelConfig* draft, int64_t max_model_len);
};

}  // namespace pagoda
