// Speculative decoding end to end on a real model (stories260K) with the n-gram proposer and with
// draft models: several tokens per sequence per step must not change what any request generates.
// Greedy and seeded requests give the tokens of plain decoding (point drafts keep the sampler's
// draws, see sample/rejection_sampler.h), alone and batched, with preemption, chunked prefill,
// prefix-cache hits, stop strings, stop ids, min_tokens, max_tokens and logprobs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>

#include "engine/llm.h"
#include "speculative/draft_model_proposer.h"
#include "support/engine_core.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

constexpr const char* kModel = "stories260K/stories260K.gguf";

std::unique_ptr<LLMEngine> make_core(const std::string& path, const EngineConfig& config) {
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

// A draft model: stories260K itself, its weights rounded to `dtype` ("auto": as stored, so the
// draft is the model), with `max_context` positions when set.
std::unique_ptr<Model> load_draft(const std::string& path, const std::string& dtype, int64_t max_context = 0,
                                  double linear_rope_factor = 0) {
  std::optional<QuantMix> mix;
  if (dtype != "auto") mix = uniform_mix(*dtype_from_name(dtype));
  auto source = load_model(path, LoadOptions{});
  EXPECT_TRUE(source.ok()) << source.status().message();
  if (!source.ok()) return nullptr;
  if (max_context > 0) source->config.max_position_embeddings = max_context;
  if (linear_rope_factor > 0) {
    source->config.rope_scaling.type = RopeScaling::Type::kLinear;
    source->config.rope_scaling.factor = linear_rope_factor;
  }
  auto backend = create_backend("cpu");
  EXPECT_TRUE(backend.ok());
  auto model = create_model(std::move(*source), **backend, {}, {}, mix);
  EXPECT_TRUE(model.ok()) << model.status().message();
  return model.ok() ? std::move(*model) : nullptr;
}

Result<std::unique_ptr<LLMEngine>> draft_core(const std::string& path, EngineConfig config,
                                               std::unique_ptr<Model> draft, int64_t k = 4) {
  cpu::register_cpu_backend({});
  auto loaded = app::load_model_and_tokenizer([&] {
    app::ModelFlags flags;
    flags.model = path;
    return flags;
  }());
  if (!loaded.ok()) return loaded.status();
  config.speculative.method = "draft_model";
  config.speculative.model = "stories260K-draft";
  config.speculative.num_speculative_tokens = k;
  return LLMEngine::create(std::move(loaded->model), std::move(loaded->tokenizer), config, std::move(draft));
}

std::unique_ptr<LLMEngine> with_draft(const std::string& path, const EngineConfig& config, const std::string& dtype,
                                       int64_t k = 4) {
  auto core = draft_core(path, config, load_draft(path, dtype), k);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return core.ok() ? std::move(*core) : nullptr;
}

const DraftModelProposer& draft_of(LLM& llm) {
  return dynamic_cast<const DraftModelProposer&>(
      *dynamic_cast<const LocalExecutor&>(llm.core().executor()).worker().proposer());
}

// A q4_0 copy of the model disagrees with it now and then: greedy output is plain decoding's,
// alone and in a batch, with drafts accepted and rejected.
TEST(Speculative, DraftModelGreedyEqualsPlainDecoding) {
  PAGODA_TEST_FILE(model, kModel);
  cpu::register_cpu_backend({});
  LLM plain(make_core(model, {}));
  LLM spec(with_draft(model, {}, "q4_0"));
  const auto rs = requests(12, greedy(80));
  expect_plain_tokens(plain, spec, rs);
  for (const GenerateRequest& r : {rs[1], rs[4]}) {
    auto a = spec.generate({r}), b = plain.generate({r});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(token_ids(*a), token_ids(*b));
  }
  const SpecDecodeStats& st = spec.core().spec_stats();
  EXPECT_GT(st.num_draft_tokens, st.num_accepted_tokens);  // some rejected: the draft rolled back
  EXPECT_GT(st.num_accepted_tokens, st.num_draft_tokens / 2);
  EXPECT_EQ(draft_of(spec).kv_manager().usage(), 0.0);  // every finished request's blocks freed
  EXPECT_NE(spec.core().speculative_summary().find("draft model stories260K-draft (5 layers"), std::string::npos)
      << spec.core().speculative_summary();
}

TEST(Speculative, DraftModelSeededSamplingEqualsPlainDecoding) {
  PAGODA_TEST_FILE(model, kModel);
  cpu::register_cpu_backend({});
  LLM plain(make_core(model, {}));
  LLM spec(with_draft(model, {}, "q8_0", 3));
  SamplingParams p;
  p.temperature = 0.7;
  p.top_p = 0.9;
  p.max_tokens = 60;
  auto rs = requests(8, p);
  for (size_t i = 0; i < rs.size(); ++i) rs[i].params.seed = 91 + i;
  expect_plain_tokens(plain, spec, rs);
}

// The model as its own draft proposes exactly what the model then computes, so every draft is
// accepted, unless the draft's KV cache fell out of step with the target's: through preemption,
// prompts arriving in chunks, prefix-cache hits and steps without speculation (more than
// disable_by_batch_size requests running) every draft must still be accepted.
TEST(Speculative, DraftModelStaysInStepThroughPreemptionChunksAndPrefixHits) {
  PAGODA_TEST_FILE(model, kModel);
  cpu::register_cpu_backend({});
  EngineConfig tight;
  tight.block_size = 4;
  tight.scheduler.max_model_len = 128;
  tight.scheduler.max_num_batched_tokens = 64;      // room for several requests' 1 + 4 tokens
  tight.scheduler.long_prefill_token_threshold = 12;  // prompts of ~30 tokens arrive in chunks
  tight.kv_cache_memory = 64 * 4 * 2 * 5 * 4 * 8 * 4 * (2 + 1.0 / 8);  // 64 blocks, the draft 72
  tight.speculative.disable_by_batch_size = 5;
  LLM spec(with_draft(model, tight, "auto", 4));
  ASSERT_EQ(spec.core().num_blocks(), 64);
  auto rs = requests(10, greedy(60));
  rs.push_back(rs[0]);  // a whole-prompt prefix hit
  auto got = spec.generate(rs);
  ASSERT_TRUE(got.ok()) << got.status().message();
  EXPECT_GT(spec.core().stats().num_preemptions, 0);
  EXPECT_GT(spec.core().stats().prefix_cache.hits, 0);
  const SpecDecodeStats& st = spec.core().spec_stats();
  EXPECT_GT(st.num_draft_tokens, 100);
  EXPECT_EQ(st.num_accepted_tokens, st.num_draft_tokens);
  EXPECT_GT(draft_of(spec).kv_manager().stats().hits, 0);  // the draft's own prefix cache
  EXPECT_EQ(draft_of(spec).kv_manager().usage(), 0.0);
  LLM plain(make_core(model, {}));
  auto want = plain.generate(rs);
  ASSERT_TRUE(want.ok());
  EXPECT_EQ(token_ids(*got), token_ids(*want));
}

// The draft's keys and values of request `a` in `x` and of `b` in `y` at positions [0, len).
bool same_kv(const DraftModelProposer& x, RequestId a, const DraftModelProposer& y, RequestId b, int64_t len) {
  const ModelConfig& c = x.model_config();
  const int64_t bs = x.kv_cache().block_size(), row = c.num_kv_heads * c.head_dim;
  const auto slot = [&](const DraftModelProposer& d, RequestId id, int64_t p) {
    return d.kv_manager().block_table(id)[static_cast<size_t>(p / bs)] * bs + p % bs;
  };
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const KvLayerView kx = x.kv_cache().layer(l), ky = y.kv_cache().layer(l);
    for (int64_t p = 0; p < len; ++p) {
      for (auto [cx, cy] : {std::pair{kx.key, ky.key}, std::pair{kx.value, ky.value}}) {
        if (std::memcmp(static_cast<const float*>(cx) + slot(x, a, p) * row,
                        static_cast<const float*>(cy) + slot(y, b, p) * row, sizeof(float) * row) != 0) {
          return false;
        }
      }
    }
  }
  return true;
}

// Rejected drafts leave stale K/V in the draft's cache past the accepted ones: the draft must
// recompute those positions. After every partial acceptance its cache and its proposals equal
// those of a fresh draft that sees the same tokens from scratch.
TEST(Speculative, DraftModelRecomputesRejectedPositions) {
  PAGODA_TEST_FILE(model, kModel);
  cpu::register_cpu_backend({});
  const auto make = [&](bool prefix_caching) {
    std::unique_ptr<Model> m = load_draft(model, "auto");
    auto kv = KvCacheTensors::allocate(m->kernels(), m->config(), 64, 4);
    EXPECT_TRUE(kv.ok());
    return std::make_unique<DraftModelProposer>(std::move(m), std::move(*kv),
                                                DraftModelProposerConfig{"draft", 4, 64, prefix_caching});
  };
  auto kept = make(true), fresh = make(false);
  std::vector<TokenId> tokens = {1, 403, 50, 72, 260, 381, 46, 1, 403};
  for (int round = 0; round < 12; ++round) {
    const ProposalRequest kept_req{7, tokens, static_cast<int64_t>(tokens.size()) - 1, 4, ""};
    const ProposalRequest fresh_req{100 + static_cast<RequestId>(round), tokens, kept_req.num_computed_tokens, 4, ""};
    const std::vector<TokenId> drafts = kept->propose({&kept_req, 1})[0];
    const std::vector<TokenId> want = fresh->propose({&fresh_req, 1})[0];
    ASSERT_EQ(drafts.size(), 4u);
    EXPECT_EQ(drafts, want) << "round " << round;
    EXPECT_TRUE(same_kv(*kept, 7, *fresh, fresh_req.id, static_cast<int64_t>(tokens.size()))) << "round " << round;
    // The target accepts the first round % 4 drafts and then emits another token than the next.
    const size_t accepted = static_cast<size_t>(round % 4);
    tokens.insert(tokens.end(), drafts.begin(), drafts.begin() + static_cast<std::ptrdiff_t>(accepted));
    tokens.push_back((drafts[accepted] + 1 + round) % 512);
    EXPECT_EQ(kept->num_computed_tokens(7), static_cast<int64_t>(tokens.size() - accepted) - 1);  // until the next call
    // Every third round a step without speculation follows (one more token before the next call).
    if (round % 3 == 2) tokens.push_back((tokens.back() * 7 + 3) % 512);
    fresh->forget(fresh_req.id);
  }
}

// The 0.999 quantile of the chi-square distribution with `dof` degrees of freedom
// (Wilson-Hilferty: within 1% for dof >= 10).
double chi_square_999(int64_t dof) {
  const double d = static_cast<double>(dof), z = 3.0902;
  return d * std::pow(1 - 2 / (9 * d) + z * std::sqrt(2 / (9 * d)), 3);
}

// Sampling with a draft model keeps the model's distribution: over thousands of seeded requests
// the first two tokens (t1 from the prompt's step, t2 at the first speculative position, verified
// against the draft's proposal) follow p(t1) p(t2 | t1), with both factors taken from the model's
// own logprobs in plain runs. The same counts are far from what a broken residual (resampling
// from all of p after a rejection, the rejected draft included) would give.
TEST(Speculative, DraftModelSamplingKeepsTheModelsDistribution) {
  PAGODA_TEST_FILE(model, kModel);
  cpu::register_cpu_backend({});
  constexpr int64_t kVocab = 512;
  EngineConfig full_logprobs;
  full_logprobs.max_logprobs = kVocab;
  LLM plain(make_core(model, full_logprobs));
  LLM spec(with_draft(model, {}, "q4_0", 2));
  const std::string prompt = "Once upon a time, there was a";
  // p(t | tokens): the model's whole distribution after `tokens`.
  const auto distribution = [&](const std::vector<TokenId>& tokens) {
    GenerateRequest r;
    r.prompt_token_ids = tokens;
    r.params.max_tokens = 1;
    r.params.logprobs = kVocab;
    auto out = plain.generate({r});
    EXPECT_TRUE(out.ok());
    std::vector<double> p(kVocab, 0.0);
    for (const TokenLogprobEntry& e : (*out)[0].outputs[0].logprobs.at(0).top_logprobs) p[static_cast<size_t>(e.token)] = std::exp(e.logprob);
    return p;
  };
  GenerateRequest probe;
  probe.prompt = prompt;
  auto prepared = plain.engine().prepare(probe);
  ASSERT_TRUE(prepared.ok());
  const std::vector<TokenId> prompt_ids = prepared->prompt_token_ids;
  const std::vector<double> p1 = distribution(prompt_ids);

  constexpr int kTrials = 4000;
  std::vector<GenerateRequest> rs(kTrials);
  for (int i = 0; i < kTrials; ++i) {
    rs[static_cast<size_t>(i)].prompt_token_ids = prompt_ids;
    rs[static_cast<size_t>(i)].params.temperature = 1.0;
    rs[static_cast<size_t>(i)].params.max_tokens = 3;  // room for drafts at the second token
    rs[static_cast<size_t>(i)].params.ignore_eos = true;
    rs[static_cast<size_t>(i)].params.seed = 5000 + i;
  }
  auto out = spec.generate(rs);
  ASSERT_TRUE(out.ok());
  std::map<std::pair<TokenId, TokenId>, int64_t> counts;
  std::map<TokenId, std::vector<double>> p2;  // p(t2 | t1) for every t1 drawn
  for (const RequestOutput& r : *out) {
    const auto& ids = r.outputs[0].token_ids;
    ASSERT_GE(ids.size(), 2u);
    ++counts[{ids[0], ids[1]}];
    if (!p2.count(ids[0])) {
      std::vector<TokenId> context = prompt_ids;
      context.push_back(ids[0]);
      p2[ids[0]] = distribution(context);
    }
  }
  const SpecDecodeStats& st = spec.core().spec_stats();
  EXPECT_GT(st.num_drafts, kTrials / 2);
  EXPECT_GT(st.num_accepted_tokens, 0);
  EXPECT_LT(st.num_accepted_tokens, st.num_draft_tokens * 9 / 10);  // many rejections: the residual path ran

  // The draft's proposal for t2 after each t1 (its greedy choice), for the broken alternative.
  app::ModelFlags q4_flags;
  q4_flags.model = model;
  q4_flags.dtype = "q4_0";
  LLM draft_alone(testing::make_engine_core(q4_flags, {}));
  std::map<TokenId, TokenId> proposal;
  for (const auto& [t1, unused] : p2) {
    GenerateRequest r;
    r.prompt_token_ids = prompt_ids;
    r.prompt_token_ids.push_back(t1);
    r.params = greedy(1);
    auto d = draft_alone.generate({r});
    ASSERT_TRUE(d.ok());
    proposal[t1] = (*d)[0].outputs[0].token_ids.at(0);
  }
  // Chi-square over (t1, t2) cells with expected count >= 5, the rest pooled.
  const auto chi_square = [&](const std::function<double(TokenId, TokenId)>& prob) {
    double chi2 = 0, rest_expected = 0;
    int64_t rest_count = 0, bins = 0;
    for (TokenId t1 = 0; t1 < kVocab; ++t1) {
      auto cond = p2.find(t1);
      for (TokenId t2 = 0; t2 < kVocab; ++t2) {
        const double e = cond == p2.end() ? 0.0 : kTrials * prob(t1, t2);
        auto c = counts.find({t1, t2});
        const int64_t n = c == counts.end() ? 0 : c->second;
        if (e >= 5) {
          chi2 += (n - e) * (n - e) / e;
          ++bins;
        } else {
          rest_expected += e;
          rest_count += n;
        }
      }
    }
    // Mass of the t1 never drawn goes to the pooled bin as well.
    for (TokenId t1 = 0; t1 < kVocab; ++t1) {
      if (!p2.count(t1)) rest_expected += kTrials * p1[static_cast<size_t>(t1)];
    }
    chi2 += (rest_count - rest_expected) * (rest_count - rest_expected) / std::max(rest_expected, 1.0);
    return std::pair{chi2, bins};
  };
  const auto [chi2, bins] = chi_square([&](TokenId t1, TokenId t2) {
    return p1[static_cast<size_t>(t1)] * p2.at(t1)[static_cast<size_t>(t2)];
  });
  ASSERT_GT(bins, 10);
  EXPECT_LT(chi2, chi_square_999(bins)) << bins << " bins";
  // Broken residual: P(t2) = (1 - p(d)) p(t2), plus p(d) for t2 = d, the draft.
  const auto [broken_chi2, broken_bins] = chi_square([&](TokenId t1, TokenId t2) {
    const std::vector<double>& p = p2.at(t1);
    const TokenId d = proposal.at(t1);
    const double pd = p[static_cast<size_t>(d)];
    return p1[static_cast<size_t>(t1)] * ((1 - pd) * p[static_cast<size_t>(t2)] + (t2 == d ? pd : 0.0));
  });
  EXPECT_GT(broken_chi2, chi_square_999(broken_bins)) << broken_bins << " bins";
}

// A draft of another vocabulary size, or with a shorter context than --max-model-len (as far as
// its rope scaling stretches it), is refused with a message naming the problem.
TEST(Speculative, RefusesAMismatchedDraftModel) {
  PAGODA_TEST_FILE(model, kModel);
  cpu::register_cpu_backend({});
  auto backend = create_backend("cpu");
  LoadOptions dummy;
  dummy.format = LoadFormat::kDummy;
  auto source = load_model("demo-random", dummy);
  ASSERT_TRUE(backend.ok() && source.ok());
  auto demo = create_model(std::move(*source), **backend);
  ASSERT_TRUE(demo.ok());
  auto other_vocab = draft_core(model, {}, std::move(*demo));
  ASSERT_FALSE(other_vocab.ok());
  EXPECT_NE(other_vocab.status().message().find("draft model stories260K-draft has a vocabulary of"), std::string::npos)
      << other_vocab.status().message();
  EngineConfig c;
  c.scheduler.max_model_len = 200;
  auto short_context = draft_core(model, c, load_draft(model, "auto", 100));
  ASSERT_FALSE(short_context.ok());
  EXPECT_NE(short_context.status().message().find("has a context of 100 tokens, shorter than --max-model-len 200"),
            std::string::npos)
      << short_context.status().message();
  // The same context stretched twice by rope scaling is long enough (its derived length counts).
  auto stretched = draft_core(model, c, load_draft(model, "auto", 100, 2.0));
  EXPECT_TRUE(stretched.ok()) << stretched.status().message();
  EXPECT_FALSE(draft_core(model, {}, nullptr).ok());  // the method without a draft
}

TEST(Speculative, RefusesBadConfigs) {
  PAGODA_TEST_FILE(model, kModel);
  app::ModelFlags flags;
  flags.model = model;
  cpu::register_cpu_backend({});
  for (auto [spec, words] : std::vector<std::pair<SpeculativeConfig, std::string>>{
           {SpeculativeConfig{"eagle", 4, 0, 0, 0, "", ""}, "method 'eagle' is not supported"},
           {SpeculativeConfig{"ngram", 0, 0, 0, 0, "", ""}, "num_speculative_tokens"},
           {SpeculativeConfig{"ngram", 4, 3, 2, 0, "", ""}, "prompt_lookup_max"},
       }) {
    EngineConfig c;
    c.speculative = spec;
    auto loaded = app::load_model_and_tokenizer(flags);
    ASSERT_TRUE(loaded.ok()) << loaded.status().message();
    auto core = LLMEngine::create(std::move(loaded->model), std::move(loaded->tokenizer), c);
    ASSERT_FALSE(core.ok()) << words;
    EXPECT_NE(core.status().message().find(words), std::string::npos) << core.status().message();
  }
}

}  // namespace
}  // namespace pagoda
