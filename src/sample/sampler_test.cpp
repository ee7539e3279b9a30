#include "sample/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

namespace pagoda {
namespace {

TEST(Sampler, GreedyPicksArgmaxLowestIdOnTies) {
  std::vector<float> logits = {0.1f, 3.0f, -1.0f, 3.0f};
  SamplerRng rng(0);
  EXPECT_EQ(sample_token(logits.data(), 4, {.temperature = 0}, rng), 1);
}

TEST(Sampler, TopKOneIsGreedy) {
  std::vector<float> logits = {0.5f, 0.1f, 2.0f, 1.9f};
  SamplerRng rng(7);
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(sample_token(logits.data(), 4, {.temperature = 1.0, .top_k = 1}, rng), 2);
  }
}

// With temperature 1 the empirical frequencies follow softmax(logits).
TEST(Sampler, FrequenciesFollowSoftmax) {
  std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f)};  // p = 1/8, 2/8, 5/8
  SamplerRng rng(42);
  std::map<TokenId, int> counts;
  const int n = 40000;
  for (int i = 0; i < n; ++i) counts[sample_token(logits.data(), 3, {}, rng)]++;
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 8, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 2.0 / 8, 0.01);
  EXPECT_NEAR(counts[2] / double(n), 5.0 / 8, 0.01);
}

TEST(Sampler, TopPKeepsSmallestNucleus) {
  std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f)};  // p = 1/8, 2/8, 5/8
  SamplerRng rng(3);
  for (int i = 0; i < 200; ++i) {
    TokenId t = sample_token(logits.data(), 3, {.top_p = 0.8}, rng);  // 5/8 < 0.8 <= 7/8
    EXPECT_NE(t, 0);
  }
  for (int i = 0; i < 50; ++i) EXPECT_EQ(sample_token(logits.data(), 3, {.top_p = 0.5}, rng), 2);
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  std::vector<float> logits = {0.0f, std::log(2.0f), std::log(5.0f)};
  SamplerRng rng(4);
  for (int i = 0; i < 200; ++i) EXPECT_NE(sample_token(logits.data(), 3, {.min_p = 0.3}, rng), 0);
}

TEST(Sampler, SameSeedSameTokens) {
  std::vector<float> logits(100);
  for (int i = 0; i < 100; ++i) logits[i] = std::sin(i * 1.7f);
  SamplerRng a(99), b(99);
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(sample_token(logits.data(), 100, {.temperature = 0.8, .top_p = 0.9}, a),
              sample_token(logits.data(), 100, {.temperature = 0.8, .top_p = 0.9}, b));
  }
}

TEST(Sampler, ValidateRejectsOutOfRange) {
  EXPECT_FALSE((SamplingParams{.temperature = -1}).validate().ok());
  EXPECT_FALSE((SamplingParams{.top_p = 0}).validate().ok());
  EXPECT_FALSE((SamplingParams{.top_k = -5}).validate().ok());
  EXPECT_FALSE((SamplingParams{.min_p = 2}).validate().ok());
  EXPECT_TRUE((SamplingParams{.temperature = 0.7, .top_p = 0.9, .top_k = 40}).validate().ok());
}

}  // namespace
}  // namespace pagoda
