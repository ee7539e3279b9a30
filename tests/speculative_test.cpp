// Speculative decoding end to end on a real model (stories260K) with the n-gram proposer: several
// tokens per sequence per step must not change what any request generates. Greedy and seeded
// requests give the tokens of plain decoding (point drafts keep the sampler's draws, see
// sample/rejection_sampler.h), alone and batched, with preemption, chunked prefill, prefix-cache
// hits, stop strings, stop ids, min_tokens, max_tokens and logprobs.
#include <gtest/gtest.h>

#include "engine/llm.h"
#include "support/engine_core.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

constexpr const char* kModel = "stories260K/stories260K.gguf";

std::unique_ptr<EngineCore> make_core(const std::string& path, const EngineConfig& config) {
  return testing::make_engine_core(path, config);
}

SpeculativeConfig ngram(int64_t k) {
  SpeculativeConfig s;
  s.method = "ngram";
  s.num_speculative_tokens = k;
  s.prompt_lookup_min = 2;
  s.prompt_lookup_max = 4;
  return s;
}

EngineConfig with_ngram(EngineConfig c, int64_t k = 4) {
  c.speculative = ngram(k);
  return c;
}

// Prompts whose continuations repeat them (the tiny model's stories repeat names and phrases),
// so that drafts are proposed, some accepted and some rejected.
std::vector<GenerateRequest> requests(int n, const SamplingParams& p) {
  const char* names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Anna"};
  std::vector<GenerateRequest> rs(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const std::string name = names[i % 6];
    rs[static_cast<size_t>(i)].prompt = "Once upon a time, there was a little girl named " + name + ". " + name +
                                        " liked to play with her ball. One day, " + name + " went to the park";
    rs[static_cast<size_t>(i)].params = p;
  }
  return rs;
}

SamplingParams greedy(int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

std::vector<std::vector<TokenId>> token_ids(const std::vector<RequestOutput>& out) {
  std::vector<std::vector<TokenId>> ids;
  for (const RequestOutput& r : out) ids.push_back(r.outputs[0].token_ids);
  return ids;
}

// `spec` gives `rs` the tokens `plain` gives them, and accepted some drafts on the way.
void expect_plain_tokens(LLM& plain, LLM& spec, const std::vector<GenerateRequest>& rs) {
  auto want = plain.generate(rs);
  auto got = spec.generate(rs);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(token_ids(*got), token_ids(*want));
  EXPECT_GT(spec.core().spec_stats().num_accepted_tokens, 0);
}

TEST(Speculative, NgramGreedyEqualsPlainDecoding) {
  PAGODA_TEST_FILE(model, kModel);
  LLM plain(make_core(model, {}));
  LLM spec(make_core(model, with_ngram({})));
  const auto rs = requests(12, greedy(80));
  auto want = plain.generate(rs);
  auto got = spec.generate(rs);
  ASSERT_TRUE(want.ok() && got.ok());
  EXPECT_EQ(token_ids(*got), token_ids(*want));
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ((*got)[i].outputs[0].text, (*want)[i].outputs[0].text) << i;
  // Each alone, too.
  for (const GenerateRequest& r : {rs[0], rs[5]}) {
    auto a = spec.generate({r}), b = plain.generate({r});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(token_ids(*a), token_ids(*b));
  }
  const SpecDecodeStats& st = spec.core().spec_stats();
  EXPECT_GT(st.num_accepted_tokens, 0);
  EXPECT_GT(st.num_draft_tokens, st.num_accepted_tokens);  // some drafts were rejected (rollback ran)
  EXPECT_LE(st.num_accepted_per_pos.size(), 4u);
  EXPECT_GE(st.num_accepted_per_pos.at(0), st.num_accepted_per_pos.back());
  EXPECT_EQ(plain.core().spec_stats().num_drafts, 0);
}

TEST(Speculative, SeededSamplingEqualsPlainDecoding) {
  PAGODA_TEST_FILE(model, kModel);
  LLM plain(make_core(model, {}));
  LLM spec(make_core(model, with_ngram({}, 3)));
  SamplingParams p;
  p.temperature = 0.7;
  p.top_p = 0.9;
  p.max_tokens = 60;
  auto rs = requests(8, p);
  for (size_t i = 0; i < rs.size(); ++i) rs[i].params.seed = 77 + i;
  expect_plain_tokens(plain, spec, rs);
}

TEST(Speculative, PreemptionChunkedPrefillAndPrefixCacheKeepOutputsExact) {
  PAGODA_TEST_FILE(model, kModel);
  EngineConfig tight;
  tight.block_size = 4;
  tight.scheduler.max_model_len = 128;
  tight.scheduler.max_num_batched_tokens = 16;  // prompts of ~30 tokens arrive in chunks
  // 64 blocks of 4 tokens (stories260K: 5 layers, 4 KV heads of 8, f32): 256 tokens for 10
  // requests of ~70 tokens each.
  tight.kv_cache_memory = 64 * 4 * 2 * 5 * 4 * 8 * 4;
  LLM spec(make_core(model, with_ngram(tight)));
  const auto rs = requests(10, greedy(40));
  auto got = spec.generate(rs);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_GT(spec.core().stats().num_preemptions, 0);
  EXPECT_GT(spec.core().spec_stats().num_accepted_tokens, 0);
  EXPECT_GT(spec.core().stats().prefix_cache.hits, 0);  // the shared prompt start, and resumed requests
  EXPECT_EQ(spec.core().stats().kv_usage, 0.0);
  LLM plain(make_core(model, {}));
  auto want = plain.generate(rs);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(token_ids(*got), token_ids(*want));
}

TEST(Speculative, StopRulesAndLogprobsApplyPerToken) {
  PAGODA_TEST_FILE(model, kModel);
  LLM plain(make_core(model, {}));
  LLM spec(make_core(model, with_ngram({}, 6)));
  auto rs = requests(6, greedy(70));
  rs[0].params.stop = {" park"};                    // a stop string inside an accepted run
  rs[1].params.max_tokens = 13;                     // ends mid-run
  rs[2].params.min_tokens = 50;                     // EOS suppressed per position
  rs[3].params.logprobs = 2;
  rs[4].params.stop = {"ball"};
  rs[4].params.include_stop_str_in_output = true;
  // The token plain decoding emits 20th, as a stop id.
  auto base = plain.generate({rs[5]});
  ASSERT_TRUE(base.ok());
  ASSERT_GT((*base)[0].outputs[0].token_ids.size(), 20u);
  rs[5].params.stop_token_ids = {(*base)[0].outputs[0].token_ids[19]};
  auto want = plain.generate(rs);
  auto got = spec.generate(rs);
  ASSERT_TRUE(want.ok() && got.ok());
  for (size_t i = 0; i < rs.size(); ++i) {
    const CompletionOutput& a = (*got)[i].outputs[0];
    const CompletionOutput& b = (*want)[i].outputs[0];
    EXPECT_EQ(a.token_ids, b.token_ids) << i;
    EXPECT_EQ(a.text, b.text) << i;
    EXPECT_EQ(a.finish_reason, b.finish_reason) << i;
    ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << i;
    for (size_t t = 0; t < a.logprobs.size(); ++t) {
      EXPECT_EQ(a.logprobs[t].token, b.logprobs[t].token);
      EXPECT_FLOAT_EQ(a.logprobs[t].logprob, b.logprobs[t].logprob);
      EXPECT_EQ(a.logprobs[t].top_logprobs.size(), b.logprobs[t].top_logprobs.size());
    }
  }
  EXPECT_EQ((*got)[1].outputs[0].token_ids.size(), 13u);
  EXPECT_GT(spec.core().spec_stats().num_accepted_tokens, 0);
}

// With penalties on, speculation still gives plain decoding's tokens. (That position j's penalties
// count drafts [0, j) as output is checked directly by the RejectionSampler test of
// verification_rows: on this model, dropping them changes no token.)
TEST(Speculative, PenaltiesSeeTheDraftsBeforeEachPosition) {
  PAGODA_TEST_FILE(model, kModel);
  LLM plain(make_core(model, {}));
  LLM spec(make_core(model, with_ngram({})));
  SamplingParams p = greedy(60);
  p.frequency_penalty = 1.5;
  p.presence_penalty = 1.0;
  p.repetition_penalty = 1.1;
  expect_plain_tokens(plain, spec, requests(6, p));
}

TEST(Speculative, TurnsItselfOffAboveDisableByBatchSize) {
  PAGODA_TEST_FILE(model, kModel);
  const auto rs = requests(12, greedy(40));
  EngineConfig off_when_busy = with_ngram({});
  off_when_busy.speculative.disable_by_batch_size = 2;
  LLM busy(make_core(model, off_when_busy));
  LLM always(make_core(model, with_ngram({})));
  auto a = busy.generate(rs), b = always.generate(rs);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(token_ids(*a), token_ids(*b));
  // 12 requests of equal length run together: drafts only for stragglers at the end, if any.
  EXPECT_LT(busy.core().spec_stats().num_drafts, always.core().spec_stats().num_drafts / 4);
}

TEST(Speculative, RefusesBadConfigs) {
  PAGODA_TEST_FILE(model, kModel);
  app::ModelFlags flags;
  flags.model = model;
  cpu::register_cpu_backend({});
  for (auto [spec, words] : std::vector<std::pair<SpeculativeConfig, std::string>>{
           {SpeculativeConfig{"eagle", 4, 0, 0, 0}, "method 'eagle' is not supported"},
           {SpeculativeConfig{"ngram", 0, 0, 0, 0}, "num_speculative_tokens"},
           {SpeculativeConfig{"ngram", 4, 3, 2, 0}, "prompt_lookup_max"},
       }) {
    EngineConfig c;
    c.speculative = spec;
    auto loaded = app::load_model_and_tokenizer(flags);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    auto core = EngineCore::create(std::move(loaded->model), std::move(loaded->tokenizer), c);
    ASSERT_FALSE(core.ok()) << words;
    EXPECT_NE(core.status().message().find(words), std::string::npos) << core.status().message();
  }
}

}  // namespace
}  // namespace pagoda
