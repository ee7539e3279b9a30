// Sampler: picks the next token from one row of logits under OpenAI-style sampling parameters.
//
// temperature 0 is greedy (argmax, lowest id on ties). Otherwise the logits are divided by the
// temperature, cut by top_k, then top_p (nucleus) and min_p, and a token is drawn from the
// renormalized distribution with the request's own RNG, so a seeded request reproduces exactly.
// Stateless; the RNG is owned by the caller (one per request).
#pragma once

#include <cstdint>
#include <random>

#include "base/status.h"
#include "base/types.h"

namespace pagoda {

struct SamplingParams {
  double temperature = 1.0;  // 0 = greedy
  double top_p = 1.0;        // (0, 1]
  int64_t top_k = 0;         // 0 or -1 = no limit
  double min_p = 0.0;        // [0, 1]

  // Checks the ranges above; the message names the bad field.
  Status validate() const;
};

using SamplerRng = std::mt19937_64;

// Returns the chosen token id from logits[0..vocab_size).
TokenId sample_token(const float* logits, int64_t vocab_size, const SamplingParams& params,
                     SamplerRng& rng);

}  // namespace pagoda
