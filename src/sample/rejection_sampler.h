// RejectionSampler: speculative decoding's verification. A proposer drafted k tokens for a
// sequence; the target model scored k + 1 positions in one pass (row j < k: the distribution for
// draft j, given the sequence and drafts [0, j); row k: the position after the last draft). This
// emits 1 to k + 1 tokens whose joint distribution is exactly that of sampling the target one
// token at a time with the request's SamplingParams (Leviathan et al. 2023; vLLM's rejection
// sampler): the accepted drafts, then either a correction at the first rejected position or, when
// every draft is accepted, a bonus token from row k.
//
// Two kinds of drafts, and the random numbers each takes from the request's generator:
//  - Point drafts (q a point mass: n-gram, or a draft model proposing its argmax). Position j
//    samples row j exactly as Sampler::sample does (greedy: the argmax, no draw; otherwise one
//    64-bit draw) and accepts draft j when the sample equals it; the first sample that differs
//    is the correction. This is the rule below with q one-hot at x: x is kept with probability
//    p(x), and on rejection the token is distributed as p without x, renormalised. The draws are
//    those of sampling without speculation, one per emitted token, in order: a seeded request
//    emits the same tokens with point drafts as without them, wherever the target's logits for a
//    position do not depend on the rows scored beside it (the engine's kernels are
//    batch-invariant).
//  - Drafts with probabilities (a draft model sampling draft j from its distribution q_j).
//    Position j draws u (one 64-bit draw, 53 bits in [0, 1)) and accepts x_j when
//    u * q_j(x_j) < p_j(x_j) (probability min(1, p / q)); else it draws the correction from
//    max(p_j - q_j, 0) renormalised (one more draw) and stops. All accepted: one draw from p_k.
//    p is the distribution Sampler::sample draws from (after penalties, temperature, top_k,
//    top_p, min_p); a greedy request accepts x_j when it is p_j's argmax, and corrects to it.
//
// Thread safety: like Sampler (scratch buffers): one per thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/types.h"
#include "sample/sampler.h"

namespace pagoda {

struct VerifiedTokens {
  std::vector<SampledToken> tokens;  // the accepted drafts, then the correction or the bonus
  int64_t num_accepted = 0;          // drafts accepted: tokens.size() - 1
};

// The rows of a request's drafts.size() + 1 verified positions, into *rows (replaced): row j
// samples as if drafts [0, j) had been emitted: its output history is `output` then those
// drafts (penalties count them), and it suppresses `min_tokens_suppressed` while output.size() + j
// < params.min_tokens. With drafts the histories point into *history (replaced; the caller
// keeps it alive while the rows are used); without, into `output`. `allowed`, when not empty,
// holds drafts.size() + 1 equal masks (SamplingRow::allowed), one a row.
void verification_rows(const SamplingParams& params, SamplerRng* rng, std::span<const TokenId> prompt,
                       std::span<const TokenId> output, std::span<const TokenId> drafts,
                       std::span<const TokenId> min_tokens_suppressed, std::vector<TokenId>* history,
                       std::vector<SamplingRow>* rows, std::span<const uint64_t> allowed = {});

class RejectionSampler {
 public:
  // logits: [drafts.size() + 1, vocab_size] f32, row-major, modified in place as Sampler::sample
  // modifies them. rows: drafts.size() + 1 rows, row j's history already holding drafts [0, j)
  // (penalties) and its suppression that of its output length (min_tokens). draft_probs: empty
  // for point drafts, else [drafts.size(), vocab_size] f32, row j the distribution draft j was
  // drawn from (non-negative, summing to 1). Logprobs, where a row asks for them, are of the raw
  // logits as Sampler::sample reports them. Draft ids outside [0, vocab_size), or rows and
  // probabilities of the wrong count, are bugs (PAGODA_CHECK).
  VerifiedTokens verify(float* logits, int64_t vocab_size, std::span<const SamplingRow> rows,
                        std::span<const TokenId> drafts, std::span<const float> draft_probs = {});

 private:
  // Position j of drafts with probabilities: accepts or corrects; returns whether it accepted.
  bool verify_position(float* row_logits, int64_t vocab_size, const SamplingRow& row, TokenId draft,
                       const float* q, SampledToken* out);

  Sampler sampler_;
  std::vector<double> p_;       // scratch: the target's distribution at one position, dense
  std::vector<float> raw_;      // scratch: a raw row kept for logprobs
};

}  // namespace pagoda
