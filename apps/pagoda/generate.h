// Single-sequence generation for the CLI: prefill the prompt in one forward pass, then decode
// one token per pass, sampling with the request's seeded RNG. The engine (continuous batching)
// replaces this loop for the server; the CLI keeps it because it is the shortest correct path.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "apps/pagoda/model_loading.h"
#include "sample/sampler.h"

namespace pagoda::app {

struct GenerateOptions {
  int64_t max_tokens = 16;
  SamplingParams sampling;
  std::optional<uint64_t> seed;  // unset: a random seed
  bool ignore_eos = false;
  int64_t block_size = 16;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;
  int64_t generated_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Generates up to max_tokens after `prompt` (token ids, BOS included if wanted), calling
// on_token for each new id as soon as it is sampled. Stops early at a stop id of the tokenizer
// (which is reported to on_token too) unless ignore_eos. Fails when the prompt is empty or
// prompt + max_tokens exceeds the model's context length.
Result<GenerateStats> generate(LoadedModel& loaded, const std::vector<TokenId>& prompt,
                               const GenerateOptions& options,
                               const std::function<void(TokenId)>& on_token);

}  // namespace pagoda::app
