#include "sample/rejection_sampler.h"

#include <algorithm>

#include "base/check.h"

namespace pagoda {
namespace {

// Uniform in [0, 1) from one 64-bit draw (53 bits), as Sampler draws.
double uniform(SamplerRng& rng) { return static_cast<double>(rng() >> 11) * 0x1.0p-53; }

}  // namespace

void verification_rows(const SamplingParams& params, SamplerRng* rng, std::span<const TokenId> prompt,
                       std::span<const TokenId> output, std::span<const TokenId> drafts,
                       std::span<const TokenId> min_tokens_suppressed, std::vector<TokenId>* history,
                       std::vector<SamplingRow>* rows, std::span<const uint64_t> allowed) {
  PAGODA_CHECK(allowed.size() % (drafts.size() + 1) == 0);
  const size_t words = allowed.size() / (drafts.size() + 1);
  std::span<const TokenId> outputs = output;
  if (!drafts.empty()) {  // (a copy only where there are drafts: it costs the output's length)
    history->assign(output.begin(), output.end());
    history->insert(history->end(), drafts.begin(), drafts.end());
    outputs = *history;
  }
  rows->clear();
  for (size_t j = 0; j <= drafts.size(); ++j) {
    const size_t num_output = output.size() + j;
    const bool before_min = static_cast<int64_t>(num_output) < params.min_tokens;
    rows->push_back(SamplingRow{&params, rng, prompt, outputs.first(num_output),
                                before_min ? min_tokens_suppressed : std::span<const TokenId>(),
                                allowed.subspan(j * words, words)});
  }
}

VerifiedTokens RejectionSampler::verify(float* logits, int64_t vocab_size, std::span<const SamplingRow> rows,
                                        std::span<const TokenId> drafts, std::span<const float> draft_probs) {
  const size_t k = drafts.size();
  PAGODA_CHECK(vocab_size > 0 && rows.size() == k + 1);
  PAGODA_CHECK(draft_probs.empty() || draft_probs.size() == k * static_cast<size_t>(vocab_size));
  for (TokenId d : drafts) PAGODA_CHECK(d >= 0 && d < vocab_size);
  VerifiedTokens out;
  out.tokens.reserve(k + 1);
  for (size_t j = 0; j <= k; ++j) {
    float* row_logits = logits + static_cast<int64_t>(j) * vocab_size;
    if (j == k || draft_probs.empty()) {
      // The bonus position, or a point draft: sample as without speculation, compare.
      out.tokens.push_back(sampler_.sample(row_logits, vocab_size, rows.subspan(j, 1))[0]);
      if (j == k || out.tokens.back().token != drafts[j]) break;
    } else {
      SampledToken t;
      const bool accepted = verify_position(row_logits, vocab_size, rows[j], drafts[j],
                                            draft_probs.data() + j * static_cast<size_t>(vocab_size), &t);
      out.tokens.push_back(std::move(t));
      if (!accepted) break;
    }
    ++out.num_accepted;
  }
  return out;
}

bool RejectionSampler::verify_position(float* row_logits, int64_t vocab_size, const SamplingRow& row, TokenId draft,
                                       const float* q, SampledToken* out) {
  const SamplingParams& params = *row.params;
  if (params.logprobs) raw_.assign(row_logits, row_logits + vocab_size);
  const std::vector<TokenProb> p = sampler_.distribution(row_logits, vocab_size, row);
  auto emit = [&](TokenId token) {
    *out = params.logprobs ? compute_logprobs(raw_.data(), vocab_size, token, *params.logprobs)
                           : SampledToken{token, 0.0f, {}};
  };
  if (params.greedy()) {  // p is the argmax alone: keep the draft when it is that, else correct to it
    emit(p.front().token);
    return p.front().token == draft;
  }
  PAGODA_CHECK(row.rng != nullptr);
  p_.assign(static_cast<size_t>(vocab_size), 0.0);
  for (const TokenProb& tp : p) p_[tp.token] = tp.prob;
  const double q_draft = q[draft];
  if (q_draft > 0 && uniform(*row.rng) * q_draft < p_[draft]) {
    emit(draft);
    return true;
  }
  // The residual max(p - q, 0), drawn over ids in increasing order. It is empty only when p <= q
  // everywhere, that is p == q up to rounding, where a rejection has probability 0 (or q gave the
  // draft no mass): p itself stands in.
  double residual = 0;
  for (const TokenProb& tp : p) residual += std::max(tp.prob - static_cast<double>(q[tp.token]), 0.0);
  const bool from_p = !(residual > 0);
  const double target = uniform(*row.rng) * (from_p ? 1.0 : residual);
  double acc = 0;
  TokenId last = p.front().token;
  for (int64_t id = 0; id < vocab_size; ++id) {
    const double mass = from_p ? p_[id] : std::max(p_[id] - static_cast<double>(q[id]), 0.0);
    if (!(mass > 0)) continue;
    acc += mass;
    last = static_cast<TokenId>(id);
    if (target < acc) break;
  }
  emit(last);
  return false;
}

}  // namespace pagoda
