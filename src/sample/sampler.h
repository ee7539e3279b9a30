// Sampler: turns a batch of logit rows into next tokens under OpenAI/vLLM sampling parameters.
//
// Sits at the end of ModelRunner::execute(): the model's logits for the rows that sample this
// step go in, one SampledToken per row comes out. Each row is processed on its own, in this order
// (vLLM's):
//   1. logit_bias is added;
//   2. ids outside the row's `allowed` mask (a structured output's grammar) are set to -inf, and
//      so are the row's `suppressed` ids (EOS / stop ids before min_tokens), unless that would
//      leave no id at all (the grammar has ended the output: it wins over min_tokens);
//   3. penalties: repetition_penalty (HF: over the ids in prompt or output, logit > 0 ? logit / r
//      : logit * r, once per distinct id), then frequency_penalty (logit -= f * count in output)
//      and presence_penalty (logit -= p if in output);
//   4. temperature < kGreedyEpsilon: greedy argmax, lowest id on ties, no RNG used. Otherwise the
//      logits are divided by the temperature, cut by top_k, then top_p (the smallest prefix of the
//      sorted distribution whose mass reaches top_p), then min_p (tokens less likely than min_p
//      times the most likely one), and one token is drawn from what remains, renormalized, with
//      exactly one 64-bit draw from the row's own generator.
// Logprobs are of the raw distribution (log_softmax of the logits as given, before any of the
// above), computed in double, like vLLM's default "raw_logprobs" mode.
//
// A seeded row gives the same tokens whatever else is in the batch: a row reads only its own
// logits, parameters, token history and generator.
//
// Thread safety: a Sampler holds only scratch buffers, so it is thread-compatible: use one Sampler
// per thread (the engine thread owns one). SamplingParams is a plain value.
#pragma once

#include <cstdint>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace pagoda {

// The request's own generator; seeded from SamplingParams::seed when set.
using SamplerRng = std::mt19937_64;

// A parameter that failed SamplingParams::check(): its name and a one-line message.
struct InvalidParam {
  std::string param;
  std::string message;
};

struct SamplingParams {
  // OpenAI / vLLM names and defaults. The four sampling knobs come first so that positional
  // initialization {temperature, top_p, top_k, min_p} (apps/pagoda/main.cpp) stays valid;
  // designated initializers must follow this declaration order.
  double temperature = 1.0;            // >= 0, finite; below kGreedyEpsilon = greedy
  double top_p = 1.0;                  // (0, 1]
  int64_t top_k = 0;                   // 0 or -1 = no limit; larger than the vocabulary = no limit
  double min_p = 0.0;                  // [0, 1]
  int64_t n = 1;                       // sequences per prompt, 1..kMaxN
  double presence_penalty = 0.0;       // [-2, 2]
  double frequency_penalty = 0.0;      // [-2, 2]
  double repetition_penalty = 1.0;     // > 0, finite (HF semantics: over prompt + output tokens)
  std::vector<std::pair<TokenId, float>> logit_bias = {};  // id -> bias in [-100, 100]; added
  std::optional<uint64_t> seed = {};
  int64_t max_tokens = 16;             // >= 1 (the engine may replace a missing value)
  int64_t min_tokens = 0;              // 0..max_tokens: EOS / stop ids suppressed before that
  std::vector<std::string> stop = {};     // stop strings (at most kMaxStop, non-empty)
  std::vector<TokenId> stop_token_ids = {};
  bool ignore_eos = false;
  bool include_stop_str_in_output = false;
  std::optional<int64_t> logprobs = {};     // top-N logprobs of each sampled token (0..kMaxLogprobs)
  std::optional<int64_t> prompt_logprobs = {};  // top-N for each prompt token (0..kMaxLogprobs)
  bool skip_special_tokens = true;

  static constexpr int64_t kMaxN = 64;           // OpenAI allows 128; 64 bounds one request's KV
  static constexpr size_t kMaxStop = 16;
  static constexpr int64_t kMaxLogprobs = 20;    // the default bound (OpenAI's top_logprobs limit)
  static constexpr double kMaxAbsPenalty = 2.0;  // presence / frequency
  static constexpr float kMaxAbsLogitBias = 100.0f;
  static constexpr double kGreedyEpsilon = 1e-5;  // vLLM's _SAMPLING_EPS

  bool operator==(const SamplingParams&) const = default;

  // True when the row samples greedily (temperature below kGreedyEpsilon).
  bool greedy() const { return temperature < kGreedyEpsilon; }

  // Checks every field against its range and token ids (logit_bias, stop_token_ids) against
  // [0, vocab_size). On failure returns the parameter at fault (its OpenAI name) and one line
  // naming it, e.g. {"top_p", "top_p must be in (0, 1], got 1.5"}. vocab_size must be > 0.
  // max_logprobs bounds logprobs and prompt_logprobs (the server's --max-logprobs).
  std::optional<InvalidParam> check(int64_t vocab_size, int64_t max_logprobs = kMaxLogprobs) const;
  // check() as a Status: invalid_argument with the message.
  Status validate(int64_t vocab_size, int64_t max_logprobs = kMaxLogprobs) const;
};

// One row of a batch to sample. Everything is borrowed for the duration of Sampler::sample().
struct SamplingRow {
  const SamplingParams* params;
  SamplerRng* rng;                          // the request's own generator; may be null if greedy
  std::span<const TokenId> prompt_tokens;   // for repetition penalty
  std::span<const TokenId> output_tokens;   // for all penalties
  std::span<const TokenId> suppressed;      // ids masked to -inf (EOS/stop ids before min_tokens)
  // When not empty, the ids that may be sampled (bit id % 64 of word id / 64, at least one set):
  // the rest are masked to -inf. A structured output's grammar mask (structured/token_grammar.h).
  std::span<const uint64_t> allowed = {};
};

struct TokenLogprob {
  TokenId token;
  float logprob;
};

struct SampledToken {
  TokenId token;
  float logprob;                  // of the chosen token under the raw distribution; 0 when
                                  // params.logprobs is unset (not computed)
  std::vector<TokenLogprob> top;  // top-N of the raw distribution (N = params.logprobs), highest
                                  // first, lowest id on ties; empty when N is 0 or unset
};

// A token and the probability a row draws it with.
struct TokenProb {
  TokenId token;
  double prob;
};

class Sampler {
 public:
  // logits: [rows.size(), vocab_size] f32, row-major. Row i is sampled with rows[i]. The logits
  // are modified in place: on return row i holds the processed logits (bias, suppression and
  // penalties applied; not divided by the temperature). Returns one SampledToken per row, in
  // order. Token ids in a row's spans outside [0, vocab_size), or a non-greedy row without an rng,
  // are bugs (PAGODA_CHECK); parameters are assumed validated. A row whose logits are all -inf
  // after processing yields its lowest id.
  std::vector<SampledToken> sample(float* logits, int64_t vocab_size,
                                   std::span<const SamplingRow> rows);

  // The distribution sample() draws `row`'s token from: the row's logits processed as sample()
  // does (in place, the same way), then temperature, top_k, top_p and min_p. Returns the tokens
  // it can draw with their probabilities (summing to 1 up to rounding), in no particular order;
  // a greedy row, or one whose logits are all -inf, gives its argmax with probability 1. Draws
  // nothing. logits: [vocab_size] f32.
  std::vector<TokenProb> distribution(float* logits, int64_t vocab_size, const SamplingRow& row);

 private:
  struct Candidate {
    float weight;  // exp((logit - max) / temperature), in [0, 1]
    float logit;
    TokenId id;
  };
  TokenId draw(const float* row, int64_t vocab_size, const SamplingParams& p, SamplerRng& rng);
  // Step 4's cuts: fills candidates_ with the tokens left and their weights (their sum in
  // *total); false when every logit is -inf.
  bool collect(const float* row, int64_t vocab_size, const SamplingParams& p, double* total);
  // Cuts candidates_ to the nucleus: best-first, keep a token while the mass before it is < target.
  void keep_nucleus(double target);

  std::vector<Candidate> candidates_;  // scratch: the tokens still in play
  std::vector<float> raw_;             // scratch: a copy of the raw row when logprobs are wanted
  std::vector<int32_t> counts_;        // scratch, all zero between calls: per-id output counts
};

// Log-softmax (raw logits, double precision) of one row: returns `token`'s logprob and the top
// num_top tokens (highest first, lowest id on ties; num_top is clamped to vocab_size). Used for
// prompt_logprobs and by Sampler. logits: [vocab_size] f32; token must be in [0, vocab_size).
SampledToken compute_logprobs(const float* logits, int64_t vocab_size, TokenId token,
                              int64_t num_top);

}  // namespace pagoda
