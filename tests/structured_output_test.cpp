// Structured outputs through the engine on a real model (stories260K): every constrained output
// follows its grammar (checked by the byte matcher on the output's text), and the constraint keeps
// the engine's promises: a constrained request gives the same tokens alone or in any batch, under
// preemption, and with speculative decoding (greedy: the same tokens as without it).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "engine/llm.h"
#include "structured/gbnf.h"
#include "structured/json_schema.h"
#include "structured/token_grammar.h"
#include "support/engine_core.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

constexpr const char* kModel = "stories260K/stories260K.gguf";

std::shared_ptr<const structured::CompiledGrammar> gbnf(const std::string& text) {
  auto g = structured::parse_gbnf(text);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? std::make_shared<const structured::CompiledGrammar>(std::move(*g)) : nullptr;
}

GrammarConstraint constraint_for(LLM& llm, std::shared_ptr<const structured::CompiledGrammar> g) {
  auto vocab = structured::TokenVocabulary::of(llm.engine().tokenizer(), llm.core().model_config().vocab_size);
  auto tg = structured::TokenGrammar::compile(std::move(g), vocab);
  EXPECT_TRUE(tg.ok()) << tg.status().message();
  return GrammarConstraint{tg.ok() ? *tg : nullptr, std::nullopt};
}

// Whether `text` follows the grammar: a prefix of a match, and a whole match when `whole`.
bool follows(const std::shared_ptr<const structured::CompiledGrammar>& g, const std::string& text, bool whole) {
  structured::GrammarMatcher m(g);
  return m.accept(text) && (!whole || m.can_end());
}

std::vector<GenerateRequest> stories(int n, const SamplingParams& p, const std::optional<GrammarConstraint>& c) {
  const char* names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Anna"};
  std::vector<GenerateRequest> rs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const std::string name = names[i % 6];
    rs[static_cast<size_t>(i)].prompt = "Once upon a time, there was a little girl named " + name + ". " + name +
                                        " liked to play with her ball. One day, " + name + " went to the";
    rs[static_cast<size_t>(i)].params = p;
    rs[static_cast<size_t>(i)].params.seed = 100 + static_cast<uint64_t>(i);
    rs[static_cast<size_t>(i)].constraint = c;
  }
  return rs;
}

SamplingParams sampled(int64_t max_tokens, double temperature = 1.0) {
  SamplingParams p;
  p.temperature = temperature;
  p.max_tokens = max_tokens;
  return p;
}

// A grammar that leaves the model some room: words from its own vocabulary, then a fixed end.
constexpr const char* kStoryGrammar = R"(
root  ::= " " place ". " name " " verb " " [a-z]+ ([a-z ,]{0,30}) "." 
place ::= "park" | "store" | "beach" | "big " [a-z]+
name  ::= "Lily" | "Tom" | "She" | "He"
verb  ::= "saw" | "found" | "wanted" | "said"
)";

TEST(StructuredOutput, SampledOutputsFollowTheGrammarAndStop) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(testing::make_engine_core(model, {}));
  auto g = gbnf(kStoryGrammar);
  ASSERT_NE(g, nullptr);
  auto rs = stories(12, sampled(60), constraint_for(llm, g));
  auto out = llm.generate(rs);
  ASSERT_TRUE(out.ok()) << out.status().message();
  int stopped = 0;
  for (const auto& r : *out) {
    const CompletionOutput& o = r.outputs[0];
    const bool stop = o.finish_reason == FinishReason::kStop;
    stopped += stop;
    EXPECT_TRUE(follows(g, o.text, stop)) << "\"" << o.text << "\"";
  }
  EXPECT_GT(stopped, 6) << "most outputs should complete the grammar within 60 tokens";
  // Unconstrained, the same prompts do not follow it.
  auto free = llm.generate(stories(12, sampled(60), std::nullopt));
  ASSERT_TRUE(free.ok());
  int following = 0;
  for (const auto& r : *free) following += follows(g, r.outputs[0].text, false);
  EXPECT_LT(following, 3);
}

TEST(StructuredOutput, AConstrainedRequestIsTheSameAloneOrBatched) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(testing::make_engine_core(model, {}));
  auto g = gbnf(kStoryGrammar);
  const GrammarConstraint c = constraint_for(llm, g);
  auto constrained = stories(6, sampled(40), c);
  auto mixed = constrained;
  for (const GenerateRequest& r : stories(6, sampled(40), std::nullopt)) mixed.push_back(r);
  std::shuffle(mixed.begin(), mixed.end(), std::mt19937(7));
  auto batched = llm.generate(mixed);
  ASSERT_TRUE(batched.ok());
  for (size_t i = 0; i < mixed.size(); ++i) {
    if (!mixed[i].constraint) continue;
    auto alone = llm.generate(std::vector<GenerateRequest>{mixed[i]});
    ASSERT_TRUE(alone.ok());
    EXPECT_EQ((*alone)[0].outputs[0].token_ids, (*batched)[i].outputs[0].token_ids) << i;
  }
}

TEST(StructuredOutput, PreemptionKeepsTheMatcherExact) {
  PAGODA_TEST_FILE(model, kModel);
  EngineConfig tight;
  tight.block_size = 4;
  tight.scheduler.max_model_len = 128;
  tight.kv_cache_memory = 64 * 4 * 2 * 5 * 4 * 8 * 4;  // 256 tokens for 10 requests of ~80
  LLM small(testing::make_engine_core(model, tight));
  LLM roomy(testing::make_engine_core(model, {}));
  auto g = gbnf(kStoryGrammar);
  auto rs = stories(10, sampled(48), constraint_for(small, g));
  auto squeezed = small.generate(rs);
  ASSERT_TRUE(squeezed.ok()) << squeezed.status().message();
  EXPECT_GT(small.core().stats().num_preemptions, 0);
  auto again = stories(10, sampled(48), constraint_for(roomy, g));
  auto free = roomy.generate(again);
  ASSERT_TRUE(free.ok());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ((*squeezed)[i].outputs[0].token_ids, (*free)[i].outputs[0].token_ids) << i;
    EXPECT_TRUE(follows(g, (*squeezed)[i].outputs[0].text, false)) << (*squeezed)[i].outputs[0].text;
  }
}

TEST(StructuredOutput, SpeculativeDraftsAreCheckedAgainstTheGrammar) {
  PAGODA_TEST_FILE(model, kModel);
  EngineConfig spec;
  spec.speculative.method = "ngram";
  spec.speculative.num_speculative_tokens = 4;
  spec.speculative.prompt_lookup_min = 2;
  spec.speculative.prompt_lookup_max = 4;
  LLM with(testing::make_engine_core(model, spec));
  LLM without(testing::make_engine_core(model, {}));
  // No capital letters: drafts copied from the prompt ("Lily liked to play") are partly valid
  // (accepted while the model agrees) and partly not (rejected by the mask whatever the model says).
  auto g = gbnf(R"(root ::= [a-z .,]{1,300})");
  auto rs = stories(6, sampled(60, 0.0), constraint_for(with, g));
  for (GenerateRequest& r : rs) r.prompt += " park. ";
  auto a = with.generate(rs);
  for (GenerateRequest& r : rs) r.constraint = constraint_for(without, g);
  auto b = without.generate(rs);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ((*a)[i].outputs[0].token_ids, (*b)[i].outputs[0].token_ids) << i;
    EXPECT_TRUE(follows(g, (*a)[i].outputs[0].text, (*a)[i].outputs[0].finish_reason == FinishReason::kStop));
  }
  EXPECT_GT(with.core().spec_stats().num_draft_tokens, 0);
  EXPECT_GT(with.core().spec_stats().num_accepted_tokens, 0);
  EXPECT_LT(with.core().spec_stats().num_accepted_tokens, with.core().spec_stats().num_draft_tokens);
}

TEST(StructuredOutput, JsonSchemaOnATinyVocabulary) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(testing::make_engine_core(model, {}));
  auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 1, "maximum": 99},
      "pets": {"type": "array", "items": {"enum": ["dog", "cat"]}, "maxItems": 3}},
      "required": ["name", "age", "pets"]})");
  auto grammar = structured::json_schema_grammar(schema, {false});
  ASSERT_TRUE(grammar.ok()) << grammar.status().message();
  auto g = std::make_shared<const structured::CompiledGrammar>(std::move(*grammar));
  auto out = llm.generate(stories(8, sampled(80), constraint_for(llm, g)));
  ASSERT_TRUE(out.ok());
  for (const auto& r : *out) {
    const CompletionOutput& o = r.outputs[0];
    EXPECT_TRUE(follows(g, o.text, o.finish_reason == FinishReason::kStop)) << o.text;
    if (o.finish_reason == FinishReason::kStop) {
      auto doc = nlohmann::json::parse(o.text, nullptr, false);
      ASSERT_FALSE(doc.is_discarded()) << o.text;
      EXPECT_GE(doc["age"].get<int>(), 1);
      EXPECT_LE(doc["age"].get<int>(), 99);
    }
  }
}

}  // namespace
}  // namespace pagoda
