// StructuredOutputs on a four-token vocabulary, where every mask can be written out by hand: the
// rows of a step with drafts, the rows before and after the end of thinking, the matcher moving
// over the tokens a sequence got, and a mask that would allow nothing.
#include "engine/structured_outputs.h"

#include <gtest/gtest.h>

#include "structured/gbnf.h"

namespace pagoda {
namespace {

// Ids: 0 "a", 1 "b", 2 "ab", 3 a control token without text (the end of thinking here). No stop
// token, so a finished match allows nothing.
std::shared_ptr<const structured::TokenGrammar> grammar(const char* gbnf) {
  auto vocab = std::make_shared<const structured::TokenVocabulary>(std::vector<std::string>{"a", "b", "ab", ""},
                                                                   std::vector<int32_t>{}, false);
  auto g = structured::parse_gbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message();
  auto tg = structured::TokenGrammar::compile(std::make_shared<const structured::CompiledGrammar>(std::move(*g)), vocab);
  EXPECT_TRUE(tg.ok());
  return *tg;
}

uint64_t bits(std::initializer_list<int> ids) {
  uint64_t w = 0;
  for (int id : ids) w |= uint64_t{1} << id;
  return w;
}

SchedulerOutput step(RequestId id, std::vector<TokenId>& drafts) {
  SchedulerOutput out;
  ScheduledSeq s;
  s.request_id = id;
  s.sample = true;
  s.draft_tokens = drafts;
  out.seqs.push_back(s);
  return out;
}

TEST(StructuredOutputs, RowsFollowTheDraftsAndTheMatcherFollowsTheTokens) {
  StructuredOutputs so(1);
  so.add(7, grammar(R"(root ::= "a" "b"* "a")"), false, std::nullopt, {});
  std::vector<TokenId> none;
  SchedulerOutput s = step(7, none);
  so.fill_masks(s);
  ASSERT_EQ(s.seqs[0].allowed_tokens.size(), 1u);
  EXPECT_EQ(s.seqs[0].allowed_tokens[0], bits({0, 2}));
  // Drafts "a", "b", "b": row j's mask is the grammar's after drafts [0, j).
  std::vector<TokenId> drafts = {0, 1, 1};
  s = step(7, drafts);
  so.fill_masks(s);
  ASSERT_EQ(s.seqs[0].allowed_tokens.size(), 4u);
  EXPECT_EQ(s.seqs[0].allowed_tokens[0], bits({0, 2}));
  EXPECT_EQ(s.seqs[0].allowed_tokens[1], bits({0, 1}));  // after "a": "b" or the closing "a"
  EXPECT_EQ(s.seqs[0].allowed_tokens[2], bits({0, 1}));
  EXPECT_EQ(s.seqs[0].allowed_tokens[3], bits({0, 1}));
  // The drafts were rolled back: the next step starts where the tokens are.
  RequestUpdate u;
  u.request_id = 7;
  u.new_tokens = {2};  // "ab"
  so.accept({&u, 1});
  s = step(7, none);
  so.fill_masks(s);
  EXPECT_EQ(s.seqs[0].allowed_tokens[0], bits({0, 1}));
  // A draft the grammar refuses: its row's mask excludes it, and the rows after repeat that mask.
  std::vector<TokenId> refused = {2, 0};
  s = step(7, refused);
  so.fill_masks(s);
  EXPECT_EQ(s.seqs[0].allowed_tokens[0], bits({0, 1}));
  EXPECT_EQ(s.seqs[0].allowed_tokens[1], bits({0, 1}));
  EXPECT_EQ(s.seqs[0].allowed_tokens[2], bits({0, 1}));
  EXPECT_EQ(so.num_refused(), 0);
}

TEST(StructuredOutputs, TheConstraintStartsAfterTheEndOfThinking) {
  StructuredOutputs so(1);
  so.add(1, grammar(R"(root ::= "a" "b")"), false, TokenId{3}, {});
  std::vector<TokenId> none;
  SchedulerOutput s = step(1, none);
  so.fill_masks(s);
  EXPECT_TRUE(s.seqs[0].allowed_tokens.empty());  // thinking: no mask
  // The end of thinking among the drafts: rows up to it are free, the grammar starts after it.
  std::vector<TokenId> drafts = {1, 3, 0};
  s = step(1, drafts);
  so.fill_masks(s);
  ASSERT_EQ(s.seqs[0].allowed_tokens.size(), 4u);
  EXPECT_EQ(s.seqs[0].allowed_tokens[0], ~uint64_t{0});
  EXPECT_EQ(s.seqs[0].allowed_tokens[1], ~uint64_t{0});
  EXPECT_EQ(s.seqs[0].allowed_tokens[2], bits({0, 2}));
  EXPECT_EQ(s.seqs[0].allowed_tokens[3], bits({1}));
  // The sequence gets "b", then the end of thinking: from the next step on, the grammar applies.
  RequestUpdate u;
  u.request_id = 1;
  u.new_tokens = {1, 3};
  so.accept({&u, 1});
  s = step(1, none);
  so.fill_masks(s);
  EXPECT_EQ(s.seqs[0].allowed_tokens[0], bits({0, 2}));
}

TEST(StructuredOutputs, AMaskThatAllowsNothingDropsTheConstraintNotTheStep) {
  StructuredOutputs so(1);
  so.add(2, grammar(R"(root ::= "ab")"), false, std::nullopt, {});
  RequestUpdate u;
  u.request_id = 2;
  u.new_tokens = {2};  // the whole match; with no stop token nothing may follow
  so.accept({&u, 1});
  std::vector<TokenId> none;
  SchedulerOutput s = step(2, none);
  so.fill_masks(s);
  ASSERT_EQ(s.seqs[0].allowed_tokens.size(), 1u);
  EXPECT_EQ(s.seqs[0].allowed_tokens[0], ~uint64_t{0});
  EXPECT_EQ(so.num_refused(), 1);
  s = step(2, none);
  so.fill_masks(s);
  EXPECT_TRUE(s.seqs[0].allowed_tokens.empty());  // unconstrained from now on
}

}  // namespace
}  // namespace pagoda
