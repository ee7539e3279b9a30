#include "sample/rejection_sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace pagoda {
namespace {

using Logits = std::vector<float>;

// Rows of `vocab` logits, one per position, back to back.
Logits rows_of(const std::vector<std::vector<float>>& rows) {
  Logits out;
  for (const auto& r : rows) out.insert(out.end(), r.begin(), r.end());
  return out;
}

std::vector<SamplingRow> sampling_rows(const SamplingParams& params, SamplerRng* rng, size_t n) {
  return std::vector<SamplingRow>(n, SamplingRow{&params, rng, {}, {}, {}});
}

std::vector<TokenId> tokens_of(const VerifiedTokens& v) {
  std::vector<TokenId> out;
  for (const SampledToken& t : v.tokens) out.push_back(t.token);
  return out;
}

// softmax(logits / t) in double: the distribution every test compares against, worked out here.
std::vector<double> softmax(const std::vector<float>& logits, double t = 1.0) {
  double m = logits[0];
  for (float v : logits) m = std::max(m, static_cast<double>(v));
  std::vector<double> p(logits.size());
  double z = 0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp((logits[i] - m) / t);
  for (double& v : p) v /= z;
  return p;
}

// Pearson's statistic of `counts` against probabilities `p` (every p_i > 0).
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& p) {
  const double n = static_cast<double>(std::accumulate(counts.begin(), counts.end(), int64_t{0}));
  double chi2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = n * p[i];
    chi2 += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
  }
  return chi2;
}

// The 0.999 quantile of the chi-square distribution with 5 degrees of freedom.
constexpr double kChi2Dof5At999 = 20.515;

const std::vector<float> kSixLogits = {2.0f, 1.0f, 0.5f, 0.0f, -0.5f, -1.0f};

TEST(RejectionSampler, GreedyKeepsTheDraftsThatAreTheArgmax) {
  const std::vector<std::vector<float>> rows = {
      {0, 0, 0, 9, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 9, 0, 0}, {0, 9, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 9, 0}};
  SamplingParams greedy;
  greedy.temperature = 0;
  const auto srows = sampling_rows(greedy, nullptr, 4);
  RejectionSampler rs;
  const std::vector<float> uniform_q(3 * 8, 1.0f / 8);
  for (bool with_q : {false, true}) {
    auto run = [&](std::vector<TokenId> drafts) {
      Logits l = rows_of(rows);
      return rs.verify(l.data(), 8, srows, drafts, with_q ? std::span<const float>(uniform_q) : std::span<const float>());
    };
    VerifiedTokens v = run({3, 5, 2});  // the third draft is not the argmax (1): corrected
    EXPECT_EQ(tokens_of(v), (std::vector<TokenId>{3, 5, 1}));
    EXPECT_EQ(v.num_accepted, 2);
    v = run({3, 5, 1});  // all kept, and the bonus position's argmax follows
    EXPECT_EQ(tokens_of(v), (std::vector<TokenId>{3, 5, 1, 6}));
    EXPECT_EQ(v.num_accepted, 3);
    v = run({4, 5, 1});
    EXPECT_EQ(tokens_of(v), (std::vector<TokenId>{3}));
    EXPECT_EQ(v.num_accepted, 0);
  }
}

TEST(RejectionSampler, PointDraftsEmitWhatSamplingWithoutSpeculationEmits) {
  // The contract: one draw per emitted token, the tokens of sampling each row in turn.
  constexpr int64_t kVocab = 50, kDrafts = 4;
  SamplingParams params;
  params.temperature = 0.9;
  params.top_p = 0.95;
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  RejectionSampler rs;
  Sampler plain;
  int64_t accepted_total = 0;
  for (uint64_t seed = 0; seed < 300; ++seed) {
    std::vector<std::vector<float>> rows(kDrafts + 1, std::vector<float>(kVocab));
    for (auto& r : rows) {
      for (float& v : r) v = normal(gen);
    }
    SamplerRng ref_rng(seed);
    std::vector<TokenId> want;
    for (const auto& r : rows) {
      std::vector<float> copy = r;
      const SamplingRow row{&params, &ref_rng, {}, {}, {}};
      want.push_back(plain.sample(copy.data(), kVocab, std::span(&row, 1))[0].token);
    }
    // Drafts that agree with those samples for the first `a` positions, then one that does not.
    const int64_t a = static_cast<int64_t>(seed % (kDrafts + 1));
    std::vector<TokenId> drafts(want.begin(), want.begin() + kDrafts);
    if (a < kDrafts) drafts[a] = (want[a] + 1) % kVocab;
    SamplerRng rng(seed);
    Logits l = rows_of(rows);
    const VerifiedTokens v = rs.verify(l.data(), kVocab, sampling_rows(params, &rng, kDrafts + 1), drafts);
    ASSERT_EQ(v.num_accepted, a) << "seed " << seed;
    ASSERT_EQ(tokens_of(v), std::vector<TokenId>(want.begin(), want.begin() + a + 1)) << "seed " << seed;
    // Exactly a + 1 draws were taken: the generator is where the plain run's was after a + 1.
    SamplerRng after(seed);
    after.discard(static_cast<unsigned long long>(a + 1));
    ASSERT_EQ(rng(), after()) << "seed " << seed;
    accepted_total += v.num_accepted;
  }
  EXPECT_GT(accepted_total, 0);
}

// The first emitted token over many seeds, for drafts of one token.
std::vector<int64_t> first_token_counts(const SamplingParams& params, TokenId point_draft,
                                        const std::vector<float>& q, int trials, int64_t* accepted) {
  const int64_t vocab = static_cast<int64_t>(kSixLogits.size());
  RejectionSampler rs;
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  *accepted = 0;
  std::discrete_distribution<TokenId> from_q(q.begin(), q.end());
  for (int s = 0; s < trials; ++s) {
    SamplerRng rng(static_cast<uint64_t>(s));
    std::mt19937 draft_rng(1000003u + static_cast<uint32_t>(s));
    const TokenId draft = q.empty() ? point_draft : from_q(draft_rng);
    Logits l = rows_of({kSixLogits, kSixLogits});
    const VerifiedTokens v = rs.verify(l.data(), vocab, sampling_rows(params, &rng, 2), std::vector<TokenId>{draft},
                                       q.empty() ? std::span<const float>() : std::span<const float>(q));
    ++counts[static_cast<size_t>(v.tokens[0].token)];
    *accepted += v.num_accepted;
  }
  return counts;
}

TEST(RejectionSampler, PointDraftThatDisagreesKeepsTheTargetDistribution) {
  SamplingParams params;  // temperature 1: p = softmax(kSixLogits)
  const std::vector<double> p = softmax(kSixLogits);
  constexpr int kTrials = 20000;
  int64_t accepted = 0;
  // Token 5 is the least likely (p = 0.02): the draft is nearly always rejected, and what is
  // emitted instead must still follow p.
  const std::vector<int64_t> counts = first_token_counts(params, 5, {}, kTrials, &accepted);
  EXPECT_LT(chi_square(counts, p), kChi2Dof5At999);
  EXPECT_EQ(accepted, counts[5]);  // a point draft is kept exactly when it is what was drawn
}

TEST(RejectionSampler, SampledDraftsKeepTheTargetDistribution) {
  SamplingParams params;
  params.temperature = 0.8;
  const std::vector<double> p = softmax(kSixLogits, 0.8);
  // The draft's distribution runs the other way: mass where the target has little.
  const std::vector<float> q = {0.05f, 0.05f, 0.1f, 0.2f, 0.25f, 0.35f};
  constexpr int kTrials = 20000;
  int64_t accepted = 0;
  const std::vector<int64_t> counts = first_token_counts(params, 0, q, kTrials, &accepted);
  EXPECT_LT(chi_square(counts, p), kChi2Dof5At999);
  // Acceptance probability is sum_i min(p_i, q_i); the count is binomial around it.
  double beta = 0;
  for (size_t i = 0; i < p.size(); ++i) beta += std::min(p[i], static_cast<double>(q[i]));
  const double sd = std::sqrt(kTrials * beta * (1 - beta));
  EXPECT_NEAR(static_cast<double>(accepted), kTrials * beta, 4 * sd);
}

TEST(RejectionSampler, SampledDraftsRespectTopK) {
  SamplingParams params;
  params.top_k = 2;  // the target only ever emits tokens 0 and 1
  const std::vector<float> q = {0.0f, 0.1f, 0.2f, 0.2f, 0.2f, 0.3f};
  constexpr int kTrials = 4000;
  int64_t accepted = 0;
  const std::vector<int64_t> counts = first_token_counts(params, 0, q, kTrials, &accepted);
  for (size_t i = 2; i < counts.size(); ++i) EXPECT_EQ(counts[i], 0) << "token " << i;
  // Tokens 0 and 1 as p = softmax(2, 1) (chi-square, 1 degree of freedom, 0.999 quantile 10.83).
  const std::vector<double> p = softmax({2.0f, 1.0f});
  EXPECT_LT(chi_square({counts[0], counts[1]}, p), 10.83);
  // Only drafts of token 1 (q 0.1 < p 0.269) can be kept, and they always are: rate 0.1.
  const double sd = std::sqrt(kTrials * 0.1 * 0.9);
  EXPECT_NEAR(static_cast<double>(accepted), kTrials * 0.1, 4 * sd);
}

TEST(RejectionSampler, VerificationRowsSeeTheDraftsBeforeThem) {
  SamplingParams params;
  params.min_tokens = 4;
  SamplerRng rng(1);
  const std::vector<TokenId> prompt = {1, 2}, output = {5, 6}, drafts = {7, 8, 9}, eos = {0};
  std::vector<TokenId> history;
  std::vector<SamplingRow> rows;
  verification_rows(params, &rng, prompt, output, drafts, eos, &history, &rows);
  ASSERT_EQ(rows.size(), 4u);
  const std::vector<std::vector<TokenId>> want = {{5, 6}, {5, 6, 7}, {5, 6, 7, 8}, {5, 6, 7, 8, 9}};
  for (size_t j = 0; j < rows.size(); ++j) {
    EXPECT_EQ(std::vector<TokenId>(rows[j].output_tokens.begin(), rows[j].output_tokens.end()), want[j]) << j;
    EXPECT_EQ(rows[j].prompt_tokens.size(), 2u);
    EXPECT_EQ(rows[j].params, &params);
    EXPECT_EQ(rows[j].rng, &rng);
    // min_tokens 4: EOS is suppressed while fewer than 4 tokens are out (2 + j).
    EXPECT_EQ(rows[j].suppressed.size(), j < 2 ? 1u : 0u) << j;
  }
  verification_rows(params, &rng, prompt, output, {}, eos, &history, &rows);
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].output_tokens.data(), output.data());  // no drafts: no copy
}

TEST(Sampler, DistributionIsWhatSampleDrawsFrom) {
  Sampler s;
  SamplingParams params;
  params.temperature = 0.5;
  params.top_k = 3;
  std::vector<float> l = kSixLogits;
  const SamplingRow row{&params, nullptr, {}, {}, {}};
  const std::vector<TokenProb> d = s.distribution(l.data(), 6, row);
  ASSERT_EQ(d.size(), 3u);
  const std::vector<double> want = softmax({2.0f, 1.0f, 0.5f}, 0.5);
  for (const TokenProb& tp : d) {
    ASSERT_GE(tp.token, 0);
    ASSERT_LT(tp.token, 3);
    EXPECT_NEAR(tp.prob, want[static_cast<size_t>(tp.token)], 1e-6);
  }
  params.temperature = 0;
  l = kSixLogits;
  const std::vector<TokenProb> g = s.distribution(l.data(), 6, row);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].token, 0);
  EXPECT_EQ(g[0].prob, 1.0);
}

}  // namespace
}  // namespace pagoda
