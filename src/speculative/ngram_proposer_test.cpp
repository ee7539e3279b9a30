#include "speculative/ngram_proposer.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace pagoda {
namespace {

using Tokens = std::vector<TokenId>;

NgramProposer proposer(int64_t k, int64_t min_n, int64_t max_n) {
  return NgramProposer(NgramProposerConfig{k, min_n, max_n});
}

// The rule as the header states it, by brute force: for n from max down to min, the earliest
// start s < len - n whose n tokens equal the last n; the proposal is what follows it.
Tokens brute_force(const Tokens& t, int64_t k, int64_t min_n, int64_t max_n) {
  const int64_t len = static_cast<int64_t>(t.size());
  for (int64_t n = max_n; n >= min_n; --n) {
    if (n > len - 1) continue;
    for (int64_t s = 0; s + n < len; ++s) {  // s + n - 1 < len - 1: not the tail itself
      if (std::equal(t.begin() + s, t.begin() + s + n, t.end() - n)) {
        const int64_t from = s + n, to = std::min(len, from + k);
        return Tokens(t.begin() + from, t.begin() + to);
      }
    }
  }
  return {};
}

TEST(NgramProposer, ProposesWhatFollowedTheTailEarlier) {
  // vLLM's worked example: the tail "2 3" occurs at position 1; what follows it is "4 2 3".
  EXPECT_EQ(proposer(4, 2, 3).propose(Tokens{1, 2, 3, 4, 2, 3}, 100), (Tokens{4, 2, 3}));
  // k bounds the proposal, and so does max_drafts (the room the context limit leaves).
  EXPECT_EQ(proposer(2, 2, 3).propose(Tokens{1, 2, 3, 4, 2, 3}, 100), (Tokens{4, 2}));
  EXPECT_EQ(proposer(4, 2, 3).propose(Tokens{1, 2, 3, 4, 2, 3}, 1), (Tokens{4}));
  EXPECT_TRUE(proposer(4, 2, 3).propose(Tokens{1, 2, 3, 4, 2, 3}, 0).empty());
}

TEST(NgramProposer, PrefersTheLongestMatchThenTheEarliest) {
  // Tail "7 8 9": "8 9" occurs at 1 (then 5) and "7 8 9" at 4; the longer one wins.
  const Tokens t{8, 9, 1, 2, 7, 8, 9, 3, 7, 8, 9};
  EXPECT_EQ(proposer(2, 1, 3).propose(t, 10), (Tokens{3, 7}));
  // Capped at 2 tokens, the earliest "8 9" (at 0) wins.
  EXPECT_EQ(proposer(2, 1, 2).propose(t, 10), (Tokens{1, 2}));
}

TEST(NgramProposer, NoMatchShortSequencesAndOverlaps) {
  EXPECT_TRUE(proposer(3, 1, 3).propose(Tokens{1, 2, 3, 4}, 10).empty());  // 4 never seen before
  EXPECT_TRUE(proposer(3, 2, 3).propose(Tokens{5}, 10).empty());
  EXPECT_TRUE(proposer(3, 2, 3).propose(Tokens{}, 10).empty());
  // A single token matched, below prompt_lookup_min 2: nothing.
  EXPECT_TRUE(proposer(3, 2, 3).propose(Tokens{1, 2, 9, 2}, 10).empty());
  // A run of one token matches itself shifted by one: the proposal continues the run.
  EXPECT_EQ(proposer(3, 2, 2).propose(Tokens{6, 6, 6, 6}, 10), (Tokens{6, 6}));
}

TEST(NgramProposer, MatchesTheRuleOnRandomSequences) {
  std::mt19937 rng(7);
  int proposals = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const int64_t len = std::uniform_int_distribution<int64_t>(0, 40)(rng);
    const int alphabet = std::uniform_int_distribution<int>(2, 6)(rng);
    Tokens t(static_cast<size_t>(len));
    for (TokenId& v : t) v = std::uniform_int_distribution<TokenId>(0, alphabet - 1)(rng);
    const int64_t min_n = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    const int64_t max_n = min_n + std::uniform_int_distribution<int64_t>(0, 4)(rng);
    const int64_t k = std::uniform_int_distribution<int64_t>(1, 6)(rng);
    const Tokens got = proposer(k, min_n, max_n).propose(t, 100);
    ASSERT_EQ(got, brute_force(t, k, min_n, max_n)) << "trial " << trial;
    proposals += got.empty() ? 0 : 1;
  }
  EXPECT_GT(proposals, 1000);  // the random cases do exercise matches
}

TEST(NgramProposer, ValidatesItsConfig) {
  EXPECT_TRUE(NgramProposerConfig({4, 1, 3}).validate().ok());
  EXPECT_NE(NgramProposerConfig({0, 1, 3}).validate().message().find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(NgramProposerConfig({129, 1, 3}).validate().message().find("num_speculative_tokens"), std::string::npos);
  EXPECT_NE(NgramProposerConfig({4, 0, 3}).validate().message().find("prompt_lookup_min"), std::string::npos);
  EXPECT_NE(NgramProposerConfig({4, 3, 2}).validate().message().find("prompt_lookup_max"), std::string::npos);
}

}  // namespace
}  // namespace pagoda
