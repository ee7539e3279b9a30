#include "sample/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <set>
#include <vector>

namespace pagoda {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Samples one row; `logits` is copied so callers can reuse it.
struct One {
  SampledToken token;
  std::vector<float> processed;  // the row after bias / suppression / penalties
};
One sample_one(std::vector<float> logits, const SamplingParams& params, SamplerRng* rng,
               std::span<const TokenId> prompt = {}, std::span<const TokenId> output = {},
               std::span<const TokenId> suppressed = {}) {
  Sampler sampler;
  SamplingRow row{&params, rng, prompt, output, suppressed};
  auto out = sampler.sample(logits.data(), static_cast<int64_t>(logits.size()), {&row, 1});
  return {out.at(0), std::move(logits)};
}

// Empirical frequencies of `draws` samples from one row.
std::map<TokenId, double> frequencies(const std::vector<float>& logits, const SamplingParams& params,
                                      uint64_t seed, int draws) {
  Sampler sampler;
  SamplerRng rng(seed);
  SamplingRow row{&params, &rng, {}, {}, {}};
  std::map<TokenId, double> freq;
  std::vector<float> scratch;
  for (int i = 0; i < draws; ++i) {
    scratch = logits;
    freq[sampler.sample(scratch.data(), static_cast<int64_t>(logits.size()), {&row, 1})[0].token] += 1.0 / draws;
  }
  return freq;
}

// The ids that were drawn at least once.
std::set<TokenId> drawn(const std::map<TokenId, double>& freq) {
  std::set<TokenId> ids;
  for (const auto& [id, f] : freq) ids.insert(id);
  return ids;
}

// log_softmax in double, as the test's oracle.
std::vector<double> log_softmax(const std::vector<float>& x) {
  double m = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (float v : x) sum += std::exp(v - m);
  std::vector<double> out;
  for (float v : x) out.push_back(v - m - std::log(sum));
  return out;
}

const std::vector<float> kThree = {0.0f, std::log(2.0f), std::log(5.0f)};  // p = 1/8, 2/8, 5/8

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  SamplerRng rng(0);
  EXPECT_EQ(sample_one({0.1f, 3.0f, -1.0f, 3.0f}, {.temperature = 0}, &rng).token.token, 1);
}

TEST(Sampler, GreedyNeedsNoRngAndLeavesItUntouched) {
  EXPECT_EQ(sample_one({0.1f, 3.0f, 5.0f}, {.temperature = 0}, nullptr).token.token, 2);
  SamplerRng rng(5), copy(5);
  sample_one({0.1f, 3.0f, 5.0f}, {.temperature = 0}, &rng);
  EXPECT_EQ(rng(), copy());
}

TEST(Sampler, TopKOneIsGreedy) {
  SamplerRng rng(7);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sample_one({0.5f, 0.1f, 2.0f, 1.9f}, {.temperature = 1.0, .top_k = 1}, &rng).token.token, 2);
  }
}

// With temperature T the empirical frequencies follow softmax(logits / T). 40000 draws: one
// standard deviation is at most 0.0025, the tolerance is 4 of them.
TEST(Sampler, FrequenciesFollowSoftmaxWithTemperature) {
  for (double t : {1.0, 0.5, 2.0}) {
    auto freq = frequencies(kThree, {.temperature = t}, 42, 40000);
    std::vector<float> scaled;
    for (float v : kThree) scaled.push_back(static_cast<float>(v / t));
    std::vector<double> want = log_softmax(scaled);
    for (TokenId id = 0; id < 3; ++id) EXPECT_NEAR(freq[id], std::exp(want[id]), 0.01) << "T=" << t << " id=" << id;
  }
}

TEST(Sampler, TopKKeepsTheKBestRenormalized) {
  std::vector<float> logits = {std::log(1.0f), std::log(3.0f), std::log(2.0f), std::log(4.0f)};
  auto freq = frequencies(logits, {.top_k = 2}, 11, 40000);  // tokens 3 and 1: 4/7, 3/7
  EXPECT_EQ(freq.count(0) + freq.count(2), 0u);
  EXPECT_NEAR(freq[3], 4.0 / 7, 0.01);
  EXPECT_NEAR(freq[1], 3.0 / 7, 0.01);
  // top_k larger than the vocabulary, and -1, mean no limit.
  EXPECT_EQ(frequencies(logits, {.top_k = 100}, 1, 2000).size(), 4u);
  EXPECT_EQ(frequencies(logits, {.top_k = -1}, 1, 2000).size(), 4u);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  auto freq = frequencies(kThree, {.top_p = 0.8}, 3, 40000);  // 5/8 < 0.8 <= 7/8: ids 2, 1
  EXPECT_EQ(freq.count(0), 0u);
  EXPECT_NEAR(freq[2], 5.0 / 7, 0.01);
  EXPECT_NEAR(freq[1], 2.0 / 7, 0.01);
  EXPECT_EQ(drawn(frequencies(kThree, {.top_p = 0.5}, 3, 200)), std::set<TokenId>{2});
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  auto freq = frequencies(kThree, {.min_p = 0.3}, 4, 40000);  // 1/8 < 0.3 * 5/8 <= 2/8
  EXPECT_EQ(freq.count(0), 0u);
  EXPECT_NEAR(freq[2], 5.0 / 7, 0.01);
  // min_p = 1 keeps only the most likely token.
  EXPECT_EQ(drawn(frequencies(kThree, {.min_p = 1.0}, 4, 200)), std::set<TokenId>{2});
}

// top_p is applied first (on the top_k distribution), then min_p.
TEST(Sampler, TopKThenTopPThenMinP) {
  // p = .4 .3 .2 .1 (ids 0..3). top_k = 3 -> .44 .33 .22; top_p = 0.7 keeps 0, 1 (0.44 < 0.7,
  // 0.77 >= 0.7); with min_p = 0.8, id 1 (0.75 of the max) goes too.
  std::vector<float> logits = {std::log(.4f), std::log(.3f), std::log(.2f), std::log(.1f)};
  auto freq = frequencies(logits, {.top_p = 0.7, .top_k = 3}, 5, 40000);
  EXPECT_EQ(freq.size(), 2u);
  EXPECT_NEAR(freq[0], 4.0 / 7, 0.01);
  EXPECT_EQ(drawn(frequencies(logits, {.top_p = 0.7, .top_k = 3, .min_p = 0.8}, 5, 500)), std::set<TokenId>{0});
  // The nucleus reaching past the min_p set: min_p alone decides (ids 0, 1, 2: 0.2 >= 0.45 * 0.4).
  auto both = frequencies(logits, {.top_p = 0.99, .min_p = 0.45}, 6, 40000);
  EXPECT_EQ(both.size(), 3u);
  EXPECT_NEAR(both[2], 2.0 / 9, 0.01);
}

// A 150k vocabulary (Qwen-sized): the cuts agree with a brute-force full sort.
TEST(Sampler, LargeVocabularyCutsMatchFullSort) {
  const int64_t vocab = 150000;
  std::vector<float> logits(vocab);
  SamplerRng gen(123);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (float& v : logits) v = normal(gen);
  const double t = 0.8, top_p = 0.9;
  std::vector<TokenId> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  });
  std::vector<double> w(vocab);
  double z = 0;
  for (int64_t i = 0; i < vocab; ++i) z += w[i] = std::exp((logits[i] - logits[order[0]]) / t);
  std::set<TokenId> nucleus;
  double above = 0;
  for (TokenId id : order) {
    if (above >= top_p * z) break;
    nucleus.insert(id);
    above += w[id];
  }
  ASSERT_GT(nucleus.size(), 10u);
  Sampler sampler;
  SamplerRng rng(9);
  SamplingParams params{.temperature = t, .top_p = top_p};
  SamplingParams with_k{.temperature = t, .top_p = top_p, .top_k = 5};
  SamplingParams with_min_p{.temperature = t, .min_p = 0.5};
  std::vector<float> scratch;
  for (int i = 0; i < 100; ++i) {
    SamplingRow rows[3] = {{&params, &rng, {}, {}, {}}, {&with_k, &rng, {}, {}, {}}, {&with_min_p, &rng, {}, {}, {}}};
    scratch.clear();
    for (int r = 0; r < 3; ++r) scratch.insert(scratch.end(), logits.begin(), logits.end());
    auto out = sampler.sample(scratch.data(), vocab, rows);
    EXPECT_TRUE(nucleus.count(out[0].token)) << out[0].token;
    EXPECT_NE(std::find(order.begin(), order.begin() + 5, out[1].token), order.begin() + 5);
    EXPECT_GE(w[out[2].token], 0.5 * w[order[0]]);
  }
}

// The nucleus is exactly the brute-force prefix: 120 comparable tokens hidden among 1200, so the
// cut falls inside a large group (the quickselect path) and every kept token is drawn often
// enough to be seen (about 50 times each).
TEST(Sampler, NucleusIsExactlyTheSortedPrefix) {
  const int64_t vocab = 1200;
  std::vector<float> logits(vocab);
  SamplerRng gen(77);
  std::uniform_real_distribution<float> high(5.0f, 5.5f), low(0.0f, 1.0f);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = i % 10 == 5 ? high(gen) : low(gen);
  for (double top_p : {0.3, 0.5}) {
    std::vector<TokenId> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](TokenId a, TokenId b) {
      return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
    });
    double z = 0;
    for (float v : logits) z += std::exp(double(v) - logits[order[0]]);
    std::set<TokenId> nucleus;
    double above = 0;
    for (TokenId id : order) {
      if (above >= top_p * z) break;
      nucleus.insert(id);
      above += std::exp(double(logits[id]) - logits[order[0]]);
    }
    ASSERT_GT(nucleus.size(), 32u);
    EXPECT_EQ(drawn(frequencies(logits, {.top_p = top_p}, 10, 5000)), nucleus) << "top_p=" << top_p;
  }
}

TEST(Sampler, RepetitionPenaltyOncePerDistinctIdInPromptOrOutput) {
  SamplerRng rng(1);
  std::vector<TokenId> prompt = {1, 1}, output = {2, 2, 2};
  auto r = sample_one({1.0f, 2.0f, -1.5f, 3.0f}, {.temperature = 0, .repetition_penalty = 2.0}, &rng, prompt, output);
  EXPECT_FLOAT_EQ(r.processed[0], 1.0f);   // absent
  EXPECT_FLOAT_EQ(r.processed[1], 1.0f);   // 2 / 2
  EXPECT_FLOAT_EQ(r.processed[2], -3.0f);  // -1.5 * 2
  EXPECT_FLOAT_EQ(r.processed[3], 3.0f);
  EXPECT_EQ(r.token.token, 3);
  // A penalty below 1 favours repeats: 3 absent, 1 -> 2 / 0.5 = 4.
  EXPECT_EQ(sample_one({1.0f, 2.0f, -1.5f, 3.0f}, {.temperature = 0, .repetition_penalty = 0.5}, &rng, prompt, output)
                .token.token, 1);
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountOutputOnly) {
  SamplerRng rng(1);
  std::vector<TokenId> prompt = {0}, output = {3, 1, 3, 3};
  SamplingParams p{.temperature = 0, .presence_penalty = 0.7, .frequency_penalty = 0.5};
  auto r = sample_one({1.0f, 2.0f, 0.0f, 4.0f}, p, &rng, prompt, output);
  EXPECT_FLOAT_EQ(r.processed[0], 1.0f);                    // prompt only: untouched
  EXPECT_FLOAT_EQ(r.processed[1], 2.0f - 0.5f - 0.7f);      // once
  EXPECT_FLOAT_EQ(r.processed[2], 0.0f);
  EXPECT_FLOAT_EQ(r.processed[3], 4.0f - 3 * 0.5f - 0.7f);  // three times
  EXPECT_EQ(r.token.token, 3);  // 1.8 still beats 1.0
  // Negative penalties encourage repeats.
  auto neg = sample_one({1.0f, 2.0f, 0.0f, 4.0f}, {.temperature = 0, .frequency_penalty = -2.0}, &rng, prompt, output);
  EXPECT_FLOAT_EQ(neg.processed[1], 4.0f);
  EXPECT_FLOAT_EQ(neg.processed[3], 10.0f);
  // All three, in vLLM's order: repetition first, then frequency and presence.
  SamplingParams all{.temperature = 0, .presence_penalty = 1.0, .frequency_penalty = 1.0, .repetition_penalty = 2.0};
  auto a = sample_one({1.0f, 2.0f, 0.0f, 4.0f}, all, &rng, prompt, output);
  EXPECT_FLOAT_EQ(a.processed[0], 0.5f);
  EXPECT_FLOAT_EQ(a.processed[1], 2.0f / 2 - 1 - 1);
  EXPECT_FLOAT_EQ(a.processed[3], 4.0f / 2 - 3 - 1);
  EXPECT_EQ(a.token.token, 0);
}

TEST(Sampler, ScratchCountsDoNotLeakBetweenRowsOrCalls) {
  Sampler sampler;
  SamplingParams p{.temperature = 0, .presence_penalty = 1.0, .frequency_penalty = 1.0, .repetition_penalty = 2.0};
  std::vector<TokenId> output = {1, 1};
  for (int call = 0; call < 3; ++call) {
    std::vector<float> logits = {1.0f, 2.0f, 1.0f, 2.0f};
    SamplingRow rows[2] = {{&p, nullptr, {}, output, {}}, {&p, nullptr, {}, {}, {}}};
    sampler.sample(logits.data(), 2, rows);
    EXPECT_FLOAT_EQ(logits[1], 2.0f / 2 - 2 - 1);
    EXPECT_FLOAT_EQ(logits[3], 2.0f);  // the second row has no history
  }
}

TEST(Sampler, LogitBiasForcesAToken) {
  SamplerRng rng(8);
  SamplingParams p{.temperature = 1.0, .logit_bias = {{0, 100.0f}, {2, -100.0f}}};
  for (int i = 0; i < 200; ++i) EXPECT_EQ(sample_one({-5.0f, 3.0f, 10.0f}, p, &rng).token.token, 0);
  auto r = sample_one({-5.0f, 3.0f, 10.0f}, {.temperature = 0, .logit_bias = {{1, 0.5f}}}, &rng);
  EXPECT_FLOAT_EQ(r.processed[1], 3.5f);
}

// The engine suppresses EOS / stop ids until min_tokens: they are never chosen, even when they
// are the most likely, even with penalties below 1 and a positive bias.
TEST(Sampler, SuppressedIdsAreNeverChosen) {
  std::vector<TokenId> suppressed = {2, 0};
  SamplerRng rng(2);
  EXPECT_EQ(sample_one({1.0f, 0.5f, 9.0f}, {.temperature = 0}, &rng, {}, {}, suppressed).token.token, 1);
  std::vector<TokenId> output = {2};
  SamplingParams p{.temperature = 2.0, .frequency_penalty = -2.0, .repetition_penalty = 0.1,
                   .logit_bias = {{2, 100.0f}}};
  for (int i = 0; i < 200; ++i) {
    auto r = sample_one({1.0f, 0.5f, 9.0f}, p, &rng, output, output, suppressed);
    EXPECT_EQ(r.token.token, 1);
    EXPECT_EQ(r.processed[2], -kInf);
  }
}

TEST(Sampler, AGrammarMaskLeavesOnlyItsIdsAndWinsOverMinTokens) {
  // 130 ids (three mask words, the last partial); the mask allows 5, 64 and 129.
  std::vector<float> logits(130, 0.0f);
  logits[7] = 50.0f;    // the best, but not allowed
  logits[64] = 1.0f;
  logits[129] = 2.0f;
  std::vector<uint64_t> mask(3, 0);
  for (int id : {5, 64, 129}) mask[static_cast<size_t>(id / 64)] |= uint64_t{1} << (id % 64);
  Sampler sampler;
  SamplerRng rng(3);
  SamplingParams greedy{.temperature = 0}, hot{.temperature = 5.0};
  std::vector<float> x = logits;
  SamplingRow row{&greedy, &rng, {}, {}, {}, mask};
  EXPECT_EQ(sampler.sample(x.data(), 130, {&row, 1})[0].token, 129);
  for (int id = 0; id < 130; ++id) {
    EXPECT_EQ(std::isinf(x[static_cast<size_t>(id)]), id != 5 && id != 64 && id != 129) << id;
  }
  std::set<TokenId> seen;
  row.params = &hot;
  for (int i = 0; i < 300; ++i) {
    x = logits;
    seen.insert(sampler.sample(x.data(), 130, {&row, 1})[0].token);
  }
  EXPECT_EQ(seen, (std::set<TokenId>{5, 64, 129}));
  // Suppressing some allowed ids leaves the rest; suppressing all of them (a grammar that allows
  // only EOS before min_tokens) would leave nothing, so the grammar wins.
  std::vector<TokenId> suppressed = {129};
  x = logits;
  row = SamplingRow{&greedy, &rng, {}, {}, suppressed, mask};
  EXPECT_EQ(sampler.sample(x.data(), 130, {&row, 1})[0].token, 64);
  std::vector<uint64_t> only(3, 0);
  only[2] = uint64_t{1} << (129 - 128);
  x = logits;
  row = SamplingRow{&greedy, &rng, {}, {}, suppressed, only};
  EXPECT_EQ(sampler.sample(x.data(), 130, {&row, 1})[0].token, 129);
}

TEST(Sampler, EverythingMaskedYieldsLowestId) {
  SamplerRng rng(2);
  std::vector<TokenId> all = {0, 1, 2};
  EXPECT_EQ(sample_one({1.0f, 2.0f, 3.0f}, {}, &rng, {}, {}, all).token.token, 0);
  EXPECT_EQ(sample_one({1.0f, 2.0f, 3.0f}, {.temperature = 0}, &rng, {}, {}, all).token.token, 0);
}

// Logprobs are log_softmax of the raw logits (before penalties, bias and temperature).
TEST(Sampler, LogprobsAreRawLogSoftmax) {
  std::vector<float> logits = {0.3f, -1.2f, 2.5f, 2.5f, 0.0f, 1.7f, -0.4f};
  std::vector<double> want = log_softmax(logits);
  SamplerRng rng(3);
  std::vector<TokenId> output = {2};
  SamplingParams p{.temperature = 0.7, .frequency_penalty = 1.5, .logit_bias = {{1, 3.0f}}, .logprobs = 3};
  for (int i = 0; i < 20; ++i) {
    auto r = sample_one(logits, p, &rng, {}, output).token;
    EXPECT_NEAR(r.logprob, want[r.token], 1e-5);
    ASSERT_EQ(r.top.size(), 3u);
    EXPECT_EQ(r.top[0].token, 2);  // tie with 3: lowest id first
    EXPECT_EQ(r.top[1].token, 3);
    EXPECT_EQ(r.top[2].token, 5);
    for (const TokenLogprob& t : r.top) EXPECT_NEAR(t.logprob, want[t.token], 1e-5);
  }
  auto zero = sample_one(logits, {.temperature = 0, .logprobs = 0}, &rng).token;
  EXPECT_EQ(zero.token, 2);
  EXPECT_NEAR(zero.logprob, want[2], 1e-5);
  EXPECT_TRUE(zero.top.empty());
  auto unset = sample_one(logits, {.temperature = 0}, &rng).token;
  EXPECT_EQ(unset.logprob, 0.0f);
  EXPECT_TRUE(unset.top.empty());
}

TEST(Sampler, ComputeLogprobsForPromptTokens) {
  std::vector<float> logits = {1.0f, 4.0f, -2.0f, 4.0f, 3.0f};
  std::vector<double> want = log_softmax(logits);
  SampledToken r = compute_logprobs(logits.data(), 5, 2, 4);
  EXPECT_EQ(r.token, 2);
  EXPECT_NEAR(r.logprob, want[2], 1e-5);
  std::vector<TokenId> ids;
  for (const TokenLogprob& t : r.top) {
    ids.push_back(t.token);
    EXPECT_NEAR(t.logprob, want[t.token], 1e-5);
  }
  EXPECT_EQ(ids, (std::vector<TokenId>{1, 3, 4, 0}));
  EXPECT_EQ(compute_logprobs(logits.data(), 5, 0, 20).top.size(), 5u);  // clamped to the vocabulary
  EXPECT_TRUE(compute_logprobs(logits.data(), 5, 0, 0).top.empty());
  // Large logits stay exact in double.
  std::vector<float> big = {1000.0f, 999.0f};
  EXPECT_NEAR(compute_logprobs(big.data(), 2, 1, 0).logprob, -1 - std::log1p(std::exp(-1.0)), 1e-6);
}

// The same seed gives the same tokens; another seed, other tokens; temperature 0 the argmax
// every time whatever the seed, and temperature 1 (or 0.8 against 1) with the same seed other
// tokens. (A sampler that ignored the seed, or the temperature, fails one of these.)
TEST(Sampler, SameSeedSameTokensOtherSeedOrTemperatureOtherTokens) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 1.7f);
  const TokenId argmax = static_cast<TokenId>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  auto draws = [&](const SamplingParams& p, uint64_t seed) {
    SamplerRng rng(seed);
    std::vector<TokenId> tokens;
    for (int i = 0; i < 100; ++i) tokens.push_back(sample_one(logits, p, &rng).token.token);
    return tokens;
  };
  const SamplingParams p{.temperature = 0.8, .top_p = 0.9};
  const std::vector<TokenId> seed99 = draws(p, 99);
  EXPECT_EQ(draws(p, 99), seed99);
  EXPECT_NE(draws(p, 100), seed99);
  EXPECT_GT(std::set<TokenId>(seed99.begin(), seed99.end()).size(), 1u);  // it does sample

  const SamplingParams greedy{.temperature = 0}, hot{.temperature = 1};
  EXPECT_EQ(draws(greedy, 99), std::vector<TokenId>(100, argmax));
  EXPECT_EQ(draws(greedy, 100), std::vector<TokenId>(100, argmax));
  EXPECT_NE(draws(hot, 99), draws(greedy, 99));
  EXPECT_NE(draws(SamplingParams{.temperature = 1, .top_p = 0.9}, 99), seed99);  // nor is 0.8 taken as 1
}

// A seeded row gives the same tokens alone and in a batch with other rows, whatever they are.
TEST(Sampler, SeededRowIsIndependentOfTheBatch) {
  const int64_t vocab = 500;
  std::vector<float> logits(vocab);
  for (int64_t i = 0; i < vocab; ++i) logits[i] = std::sin(i * 0.37f) * 4;
  SamplingParams mine{.temperature = 0.9, .top_p = 0.95, .top_k = 50, .presence_penalty = 0.5, .seed = 1234};
  SamplingParams greedy{.temperature = 0, .repetition_penalty = 1.3};
  SamplingParams other{.temperature = 1.5, .min_p = 0.05, .frequency_penalty = 1.0, .logprobs = 5};

  auto run = [&](bool batched) {
    Sampler sampler;
    SamplerRng my_rng(*mine.seed), other_rng(77), other_rng2(78);
    std::vector<TokenId> my_out, g_out, o_out, o2_out;
    for (int step = 0; step < 60; ++step) {
      std::vector<SamplingRow> rows;
      if (batched) {
        rows.push_back({&other, &other_rng, {}, o_out, {}});
        rows.push_back({&greedy, nullptr, {}, g_out, {}});
      }
      rows.push_back({&mine, &my_rng, {}, my_out, {}});
      if (batched) rows.push_back({&other, &other_rng2, {}, o2_out, {}});
      std::vector<float> batch;
      for (size_t r = 0; r < rows.size(); ++r) {
        for (int64_t i = 0; i < vocab; ++i) batch.push_back(logits[i] + (batched ? 0.1f * float(r) * float(i % 7) : 0.0f));
      }
      if (batched) {  // the other rows see different logits; mine (row 2) sees the plain ones
        std::copy(logits.begin(), logits.end(), batch.begin() + 2 * vocab);
      }
      auto out = sampler.sample(batch.data(), vocab, rows);
      if (batched) {
        o_out.push_back(out[0].token);
        g_out.push_back(out[1].token);
        o2_out.push_back(out[3].token);
        my_out.push_back(out[2].token);
      } else {
        my_out.push_back(out[0].token);
      }
    }
    return my_out;
  };
  std::vector<TokenId> alone = run(false), batched = run(true);
  EXPECT_EQ(alone, batched);
  EXPECT_GT(std::set<TokenId>(alone.begin(), alone.end()).size(), 5u);  // really sampling
}

struct BadParams {
  SamplingParams params;
  std::string message;
};

TEST(SamplingParams, ValidateNamesEveryBadField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const BadParams cases[] = {
      {{.n = 0}, "n must be in [1, 64], got 0"},
      {{.n = 65}, "n must be in [1, 64], got 65"},
      {{.temperature = -1}, "temperature must be a finite number >= 0, got -1"},
      {{.temperature = nan}, "temperature must be a finite number >= 0, got nan"},
      {{.temperature = HUGE_VAL}, "temperature must be a finite number >= 0, got inf"},
      {{.top_p = 1.5}, "top_p must be in (0, 1], got 1.5"},
      {{.top_p = 0}, "top_p must be in (0, 1], got 0"},
      {{.top_p = nan}, "top_p must be in (0, 1], got nan"},
      {{.top_k = -5}, "top_k must be -1 or >= 0 (-1 and 0 mean no limit), got -5"},
      {{.min_p = 2}, "min_p must be in [0, 1], got 2"},
      {{.min_p = -0.1}, "min_p must be in [0, 1], got -0.1"},
      {{.presence_penalty = 2.5}, "presence_penalty must be in [-2, 2], got 2.5"},
      {{.presence_penalty = nan}, "presence_penalty must be in [-2, 2], got nan"},
      {{.frequency_penalty = -3}, "frequency_penalty must be in [-2, 2], got -3"},
      {{.repetition_penalty = 0}, "repetition_penalty must be a finite number > 0, got 0"},
      {{.repetition_penalty = HUGE_VAL}, "repetition_penalty must be a finite number > 0, got inf"},
      {{.logit_bias = {{1000, 1.0f}}}, "logit_bias token id 1000 is outside the vocabulary [0, 1000)"},
      {{.logit_bias = {{-1, 1.0f}}}, "logit_bias token id -1 is outside the vocabulary [0, 1000)"},
      {{.logit_bias = {{5, 100.5f}}}, "logit_bias value for token 5 must be in [-100, 100], got 100.5"},
      {{.max_tokens = 0}, "max_tokens must be >= 1, got 0"},
      {{.max_tokens = 8, .min_tokens = 9}, "min_tokens must be in [0, max_tokens = 8], got 9"},
      {{.min_tokens = -1}, "min_tokens must be in [0, max_tokens = 16], got -1"},
      {{.stop = std::vector<std::string>(17, "x")}, "stop may hold at most 16 strings, got 17"},
      {{.stop = {"a", ""}}, "stop strings must be non-empty (stop[1] is empty)"},
      {{.stop_token_ids = {2, 1000}}, "stop_token_ids[1] = 1000 is outside the vocabulary [0, 1000)"},
      {{.logprobs = 21}, "logprobs must be in [0, 20], got 21"},
      {{.logprobs = -1}, "logprobs must be in [0, 20], got -1"},
      {{.prompt_logprobs = 21}, "prompt_logprobs must be in [0, 20], got 21"},
  };
  for (const BadParams& c : cases) {
    Status s = c.params.validate(1000);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(s.message(), c.message);
  }
}

TEST(SamplingParams, ValidateAcceptsDefaultsAndEdges) {
  EXPECT_TRUE(SamplingParams{}.validate(1000).ok());
  SamplingParams edges{.temperature = 0, .top_p = 1, .top_k = -1, .min_p = 1, .n = 64,
                       .presence_penalty = -2, .frequency_penalty = 2, .repetition_penalty = 1e-3,
                       .logit_bias = {{0, -100.0f}, {999, 100.0f}}, .seed = 0, .max_tokens = 1,
                       .min_tokens = 1, .stop = std::vector<std::string>(16, "x"), .stop_token_ids = {0, 999},
                       .logprobs = 20, .prompt_logprobs = 0};
  EXPECT_TRUE(edges.validate(1000).ok()) << edges.validate(1000).message();
  EXPECT_TRUE((SamplingParams{.temperature = 0.7, .top_p = 0.9, .top_k = 40}).validate(1000).ok());
  EXPECT_TRUE((SamplingParams{.top_k = 5000}).validate(1000).ok());  // larger than vocab: no limit
}

}  // namespace
}  // namespace pagoda
