// The engine on a real model (stories260K): continuous batching must not change what any request
// generates. Batched = alone, chunked = unchunked, cached = uncached, preempted = never preempted;
// plus stop strings, n > 1, logprobs, rejection and abort.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <fstream>
#include <functional>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "engine/engine.h"
#include "engine/llm.h"
#include "support/engine_core.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

constexpr const char* kModel = "stories260K/stories260K.gguf";

std::unique_ptr<LLMEngine> make_core(const std::string& path, EngineConfig config) {
  app::ModelFlags flags;
  flags.model = path;
  return testing::make_engine_core(flags, config);
}

std::vector<std::string> stories_prompts(int n) {
  const char* names[] = {"Lily", "Tom", "Ben", "Sue", "Max", "Anna", "Tim", "Mia"};
  const char* things[] = {"a red ball", "a big dog", "a little cat", "a toy car"};
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    std::string p = "Once upon a time, " + std::string(names[i % 8]) + " found " + things[(i / 8) % 4];
    if (i % 3 == 1) p += ". " + std::string(names[(i + 3) % 8]) + " was happy";
    out.push_back(p);
  }
  return out;
}

std::vector<GenerateRequest> requests_for(const std::vector<std::string>& prompts, const SamplingParams& p) {
  std::vector<GenerateRequest> rs(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    rs[i].prompt = prompts[i];
    rs[i].params = p;
  }
  return rs;
}

// stories260K with one sequence running at a time: the others wait in the scheduler.
std::unique_ptr<LLMEngine> one_at_a_time_core(const std::string& path) {
  EngineConfig c;
  c.scheduler.max_num_seqs = 1;
  return make_core(path, c);
}

// vLLM's metrics for an engine over `core`, under the model name "stories".
std::shared_ptr<metrics::EngineMetrics> metrics_for(const EngineCore& core) {
  metrics::CacheConfigInfo info;
  info.block_size = core.config().block_size;
  info.num_blocks = core.num_blocks();
  return std::make_shared<metrics::EngineMetrics>("stories", info, core.config().scheduler.max_model_len);
}

SamplingParams greedy(int64_t max_tokens) {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = max_tokens;
  return p;
}

// Each prompt run alone, in its own engine call.
std::vector<std::vector<TokenId>> run_alone(LLM& llm, const std::vector<GenerateRequest>& rs) {
  std::vector<std::vector<TokenId>> out;
  for (const auto& r : rs) {
    auto res = llm.generate(std::vector<GenerateRequest>{r});
    EXPECT_TRUE(res.ok());
    out.push_back(res.ok() ? (*res)[0].outputs[0].token_ids : std::vector<TokenId>{});
  }
  return out;
}

// --max-model-len beyond the trained context only as far as the rope scaling stretches it
// (vLLM's derived max_model_len): its default, its bound, and the message when past it.
TEST(Engine, MaxModelLenFollowsRopeScaling) {
  ModelConfig m;
  m.max_position_embeddings = 32768;
  EngineConfig plain;
  plain.scheduler.max_model_len = 0;
  ASSERT_TRUE(plain.validate(&m).ok());
  EXPECT_EQ(plain.scheduler.max_model_len, 32768);
  m.rope_scaling.type = RopeScaling::Type::kYarn;
  m.rope_scaling.factor = 4;
  m.rope_scaling.original_max_position_embeddings = 32768;
  EngineConfig yarn;
  yarn.scheduler.max_model_len = 0;
  ASSERT_TRUE(yarn.validate(&m).ok());
  EXPECT_EQ(yarn.scheduler.max_model_len, 131072);
  EngineConfig too_long;
  too_long.scheduler.max_model_len = 131073;
  const Status st = too_long.validate(&m);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("[1, 131072] (the model's context length, with its rope scaling; "), std::string::npos)
      << st.message();
  m.rope_scaling.type = RopeScaling::Type::kLlama3;  // Llama 3.1's declares its context as it is
  EngineConfig llama3;
  llama3.scheduler.max_model_len = 0;
  ASSERT_TRUE(llama3.validate(&m).ok());
  EXPECT_EQ(llama3.scheduler.max_model_len, 32768);
}

TEST(Engine, BatchOf32EqualsEachAlone) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(make_core(model, {}));
  auto rs = requests_for(stories_prompts(32), greedy(40));
  auto batched = llm.generate(rs);
  ASSERT_TRUE(batched.ok()) << batched.status().message();
  auto alone = run_alone(llm, rs);
  for (size_t i = 0; i < rs.size(); ++i) {
    EXPECT_EQ((*batched)[i].outputs[0].token_ids, alone[i]) << "prompt " << i;
    EXPECT_EQ((*batched)[i].outputs[0].token_ids.size(), 40u);
  }
}

// LLM::generate's `interrupted`: true after a step aborts the call's requests (they stop there)
// and fails; the LLM then serves the next call as if nothing had happened.
TEST(Engine, InterruptedGenerateAbortsAndTheLlmStaysUsable) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(make_core(model, {}));
  auto rs = requests_for(stories_prompts(4), greedy(40));
  int steps = 0;
  auto interrupted = llm.generate(rs, {}, [&] { return ++steps == 3; });
  ASSERT_FALSE(interrupted.ok());
  EXPECT_NE(interrupted.status().message().find("interrupted"), std::string::npos) << interrupted.status().message();
  EXPECT_EQ(steps, 3);
  EXPECT_FALSE(llm.core().has_unfinished());
  auto again = llm.generate(rs);
  ASSERT_TRUE(again.ok()) << again.status().message();
  auto alone = run_alone(llm, rs);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ((*again)[i].outputs[0].token_ids, alone[i]) << "prompt " << i;
}

TEST(Engine, SeededSamplingIgnoresBatchComposition) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(make_core(model, {}));
  SamplingParams p;
  p.temperature = 0.9;
  p.top_p = 0.95;
  p.max_tokens = 30;
  auto rs = requests_for(stories_prompts(12), p);
  for (size_t i = 0; i < rs.size(); ++i) rs[i].params.seed = 1000 + i;
  auto batched = llm.generate(rs);
  ASSERT_TRUE(batched.ok());
  // A different batch: every other request, in reverse order.
  std::vector<GenerateRequest> other;
  for (size_t i = rs.size(); i-- > 0;) if (i % 2 == 0) other.push_back(rs[i]);
  auto second = llm.generate(other);
  ASSERT_TRUE(second.ok());
  for (size_t k = 0; k < other.size(); ++k) {
    size_t i = rs.size() - 2 - 2 * k + (rs.size() % 2);
    EXPECT_EQ((*second)[k].outputs[0].token_ids, (*batched)[i].outputs[0].token_ids) << i;
  }
  auto alone = run_alone(llm, {rs[3]});
  EXPECT_EQ(alone[0], (*batched)[3].outputs[0].token_ids);
}

TEST(Engine, ChunkedPrefillEqualsUnchunked) {
  PAGODA_TEST_FILE(model, kModel);
  EngineConfig small;
  small.scheduler.max_num_batched_tokens = 8;
  LLM chunked(make_core(model, small));
  LLM whole(make_core(model, {}));
  auto rs = requests_for(stories_prompts(6), greedy(20));
  rs[0].prompt += ", and they played together all day long in the sunny park near the river";
  auto a = chunked.generate(rs), b = whole.generate(rs);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ((*a)[i].outputs[0].token_ids, (*b)[i].outputs[0].token_ids) << i;
}

TEST(Engine, PrefixCacheComputesOnlyTheTail) {
  PAGODA_TEST_FILE(model, kModel);
  LLM cached(make_core(model, {}));
  EngineConfig off;
  off.enable_prefix_caching = false;
  LLM uncached(make_core(model, off));
  // A shared prefix of at least 3 blocks of 16 tokens.
  std::string prefix =
      "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
      "with her friends. One day, she saw a big red ball under a tree and ran to get it";
  GenerateRequest first, second;
  first.prompt = prefix + " and her dog.";
  second.prompt = prefix + ". One day, she saw a bird.";
  first.params = second.params = greedy(24);
  for (GenerateRequest* r : {&first, &second}) {
    auto prepared = cached.engine().prepare(*r);
    ASSERT_TRUE(prepared.ok());
    r->prompt_token_ids = prepared->prompt_token_ids;
  }
  size_t common = 0;
  while (common < first.prompt_token_ids.size() && first.prompt_token_ids[common] == second.prompt_token_ids[common]) ++common;
  ASSERT_GE(common, 48u) << "the shared prefix must span 3 blocks";
  auto r1 = cached.generate({first});
  auto r2 = cached.generate({second});
  ASSERT_TRUE(r1.ok() && r2.ok());
  EXPECT_EQ((*r1)[0].cached_tokens, 0);
  EXPECT_EQ((*r2)[0].cached_tokens, static_cast<int64_t>(common / 16 * 16));
  EXPECT_GT(cached.core().stats().prefix_cache.hits, 0);
  auto u2 = uncached.generate({second});
  ASSERT_TRUE(u2.ok());
  EXPECT_EQ((*u2)[0].cached_tokens, 0);
  EXPECT_EQ((*r2)[0].outputs[0].token_ids, (*u2)[0].outputs[0].token_ids);
  EXPECT_EQ(uncached.core().stats().prefix_cache.hits, 0);
}

TEST(Engine, PreemptionKeepsOutputsExact) {
  PAGODA_TEST_FILE(model, kModel);
  EngineConfig tight;
  tight.block_size = 4;
  tight.scheduler.max_model_len = 128;
  // 64 blocks of 4 tokens = 256 tokens for 10 requests of ~60 tokens each.
  tight.kv_cache_memory = 64 * 4 * 2 * 5 * 4 * 8 * 4;
  auto core = make_core(model, tight);
  ASSERT_TRUE(core);
  LLM llm(std::move(core));
  auto rs = requests_for(stories_prompts(10), greedy(48));
  auto batched = llm.generate(rs);
  ASSERT_TRUE(batched.ok()) << batched.status().message();
  EXPECT_GT(llm.core().stats().num_preemptions, 0);
  LLM roomy(make_core(model, {}));
  auto alone = run_alone(roomy, rs);
  for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ((*batched)[i].outputs[0].token_ids, alone[i]) << i;
  EXPECT_EQ(llm.core().stats().kv_usage, 0.0);
}

// A KV cache of a narrower dtype: preemption (recomputed rows are stored the same way) and prefix
// caching (reused rows are the rows the request would have stored) give exactly the tokens of a
// roomy, unshared cache of the same dtype; the same memory holds more blocks.
TEST(Engine, QuantizedKvCacheKeepsPreemptionAndPrefixCachingExact) {
  PAGODA_TEST_FILE(model, kModel);
  // stories260K: 5 layers, 4 KV heads of 8: a 4-token block is 2 x 5 x 4 x 4 rows.
  const int64_t rows_per_block = 2 * 5 * 4 * 4;
  for (KvCacheDtype t : {KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3, KvCacheDtype::kInt8}) {
    SCOPED_TRACE(std::string(kv_cache_dtype_name(t)));
    const int64_t block_bytes = rows_per_block * (8 * kv_cache_elem_bytes(t) + (t == KvCacheDtype::kInt8 ? 4 : 0));
    EngineConfig tight;
    tight.block_size = 4;
    tight.scheduler.max_model_len = 128;
    tight.kv_cache_dtype = t;
    tight.kv_cache_memory = 64 * block_bytes;
    auto core = make_core(model, tight);
    ASSERT_TRUE(core);
    EXPECT_EQ(core->core().num_blocks(), 64);
    LLM llm(std::move(core));
    auto rs = requests_for(stories_prompts(10), greedy(48));
    auto batched = llm.generate(rs);
    ASSERT_TRUE(batched.ok()) << batched.status().message();
    EXPECT_GT(llm.core().stats().num_preemptions, 0);
    EngineConfig roomy;
    roomy.kv_cache_dtype = t;
    roomy.enable_prefix_caching = false;
    LLM alone_llm(make_core(model, roomy));
    auto alone = run_alone(alone_llm, rs);
    for (size_t i = 0; i < rs.size(); ++i) EXPECT_EQ((*batched)[i].outputs[0].token_ids, alone[i]) << i;

    EngineConfig cached_config;
    cached_config.kv_cache_dtype = t;
    LLM cached(make_core(model, cached_config));
    GenerateRequest first, second;
    first.prompt = std::string(60, 'a') + " Once upon a time, there was a girl named Lily and her dog.";
    second.prompt = std::string(60, 'a') + " Once upon a time, there was a girl named Lily. She saw a bird.";
    first.params = second.params = greedy(24);
    ASSERT_TRUE(cached.generate({first}).ok());
    auto reused = cached.generate({second});
    ASSERT_TRUE(reused.ok());
    EXPECT_GT((*reused)[0].cached_tokens, 0);
    auto fresh = alone_llm.generate({second});
    ASSERT_TRUE(fresh.ok());
    EXPECT_EQ((*reused)[0].outputs[0].token_ids, (*fresh)[0].outputs[0].token_ids);
  }
}

// Prefix caching and preemption at a long context: stories260K stretched 16 times by linear rope
// scaling (--hf-overrides) to 32,768 positions, an fp8 KV cache in blocks of 16. A 32,000-token
// prompt run twice: the second finds all its full blocks but the last token's cached and gives
// the same tokens. Two 16,384-token prompts in a cache of 2,056 blocks (their prompts take 2,048)
// run out of blocks while decoding, so one is preempted and recomputed: each gives what it gives
// alone in a roomy cache.
TEST(Engine, PrefixCachingAndPreemptionAt32kTokens) {
  PAGODA_TEST_FILE(model, kModel);
  app::ModelFlags flags;
  flags.model = model;
  flags.hf_overrides = R"({"rope_scaling": {"rope_type": "linear", "factor": 16}})";
  // stories260K: 5 layers, 4 KV heads of 8; fp8: a block of 16 tokens is 2 x 5 x 4 x 16 x 8 bytes.
  const int64_t block_bytes = 2 * 5 * 4 * 16 * 8;
  auto config = [&](int64_t blocks) {
    EngineConfig c;
    c.block_size = 16;
    c.kv_cache_dtype = KvCacheDtype::kFp8E4M3;
    c.scheduler.max_model_len = 32768;
    c.kv_cache_memory = blocks * block_bytes;
    return c;
  };
  std::mt19937 rng(32);
  std::uniform_int_distribution<TokenId> token(3, 511);
  auto random_prompt = [&](int64_t n) {
    GenerateRequest r;
    for (int64_t i = 0; i < n; ++i) r.prompt_token_ids.push_back(token(rng));
    r.params = greedy(8);
    return r;
  };

  LLM llm(testing::make_engine_core(flags, config(2056)));
  const GenerateRequest longest = random_prompt(32000);
  auto first = llm.generate({longest});
  ASSERT_TRUE(first.ok()) << first.status().message();
  auto again = llm.generate({longest});
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ((*first)[0].cached_tokens, 0);
  EXPECT_EQ((*again)[0].cached_tokens, 31984);
  EXPECT_EQ((*again)[0].outputs[0].token_ids, (*first)[0].outputs[0].token_ids);

  std::vector<GenerateRequest> two = {random_prompt(16384), random_prompt(16384)};
  for (GenerateRequest& r : two) r.params = greedy(200);
  auto together = llm.generate(two);
  ASSERT_TRUE(together.ok()) << together.status().message();
  EXPECT_GT(llm.core().stats().num_preemptions, 0);
  EngineConfig roomy = config(4200);
  roomy.enable_prefix_caching = false;
  LLM alone_llm(testing::make_engine_core(flags, roomy));
  const auto alone = run_alone(alone_llm, two);
  for (size_t i = 0; i < two.size(); ++i) EXPECT_EQ((*together)[i].outputs[0].token_ids, alone[i]) << i;
  EXPECT_EQ(llm.core().stats().kv_usage, 0.0);
}

TEST(Engine, StopStringSpanningTokens) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(make_core(model, {}));
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.params = greedy(40);
  auto base = llm.generate({r});
  ASSERT_TRUE(base.ok());
  const std::string full = (*base)[0].outputs[0].text;
  // A stop string made of the last 2 bytes of one token's text and the first 2 of the next's.
  app::ModelFlags flags;
  flags.model = model;
  auto tokenizer = app::load_tokenizer(flags);
  ASSERT_TRUE(tokenizer.ok());
  const auto& ids = (*base)[0].outputs[0].token_ids;
  size_t offset = 0, k = 0;
  std::string stop;
  for (; k + 1 < ids.size(); ++k) {
    std::string a = (*tokenizer)->decode(std::vector<TokenId>(ids.begin(), ids.begin() + k + 1), true);
    std::string b = (*tokenizer)->decode(std::vector<TokenId>(ids.begin(), ids.begin() + k + 2), true);
    if (k > 5 && a.size() >= 2 && b.size() >= a.size() + 3 && a.back() != ' ') {
      stop = b.substr(a.size() - 2, 4);  // 2 bytes from token k, 2 from token k + 1
      offset = a.size() - 2;
      break;
    }
  }
  ASSERT_FALSE(stop.empty());
  ASSERT_EQ(full.find(stop), offset) << "pick a stop string whose first occurrence spans the tokens";
  r.params.stop = {stop};
  auto cut = llm.generate({r});
  ASSERT_TRUE(cut.ok());
  EXPECT_EQ((*cut)[0].outputs[0].text, full.substr(0, offset));
  EXPECT_EQ((*cut)[0].outputs[0].finish_reason, FinishReason::kStop);
  EXPECT_EQ((*cut)[0].outputs[0].stop_string, stop);
  r.params.include_stop_str_in_output = true;
  auto kept = llm.generate({r});
  ASSERT_TRUE(kept.ok());
  EXPECT_EQ((*kept)[0].outputs[0].text, full.substr(0, offset + stop.size()));
}

TEST(Engine, StopTokenIdsMinTokensAndTimings) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(make_core(model, {}));
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.params = greedy(20);
  auto base = llm.generate({r});
  ASSERT_TRUE(base.ok());
  const std::vector<TokenId> free_run = (*base)[0].outputs[0].token_ids;
  ASSERT_EQ(free_run.size(), 20u);
  const TokenId third = free_run[2];

  r.params.stop_token_ids = {third};
  auto stopped = llm.generate({r});
  ASSERT_TRUE(stopped.ok());
  const CompletionOutput& o = (*stopped)[0].outputs[0];
  EXPECT_EQ(o.token_ids, std::vector<TokenId>(free_run.begin(), free_run.begin() + 3));
  EXPECT_EQ(o.finish_reason, FinishReason::kStop);
  EXPECT_EQ(o.stop_token, third);
  EXPECT_EQ((*stopped)[0].completion_tokens, 3);
  const RequestTimings& t = (*stopped)[0].timings;
  EXPECT_LE(t.queued_s, t.first_token_s);
  EXPECT_LE(t.first_token_s, t.finished_s);
  EXPECT_GT(t.finished_s, 0);

  // With min_tokens the stop id cannot be sampled (or end the request) before 5 tokens are out.
  r.params.min_tokens = 5;
  auto held = llm.generate({r});
  ASSERT_TRUE(held.ok());
  const auto& ids = (*held)[0].outputs[0].token_ids;
  ASSERT_GT(ids.size(), 5u);
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(ids[i], third) << i;
  EXPECT_EQ(ids[0], free_run[0]);
  EXPECT_EQ(ids[1], free_run[1]);
}

TEST(Engine, NSequencesShareThePromptAndFollowTheirSeeds) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(make_core(model, {}));
  GenerateRequest r;
  r.prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park";
  r.params.temperature = 1.0;
  r.params.max_tokens = 20;
  r.params.n = 3;
  r.params.seed = 77;
  auto res = llm.generate({r});
  ASSERT_TRUE(res.ok());
  ASSERT_EQ((*res)[0].outputs.size(), 3u);
  EXPECT_GT((*res)[0].cached_tokens, 0);  // later sequences hit the first one's prompt blocks
  EXPECT_EQ((*res)[0].completion_tokens, 60);
  for (int64_t i = 0; i < 3; ++i) {
    GenerateRequest one = r;
    one.params.n = 1;
    one.params.seed = 77 + i;
    auto single = llm.generate({one});
    ASSERT_TRUE(single.ok());
    EXPECT_EQ((*single)[0].outputs[0].token_ids, (*res)[0].outputs[static_cast<size_t>(i)].token_ids) << i;
  }
  EXPECT_NE((*res)[0].outputs[0].token_ids, (*res)[0].outputs[1].token_ids);
}

TEST(Engine, LogprobsOfGreedyTokens) {
  PAGODA_TEST_FILE(model, kModel);
  LLM llm(make_core(model, {}));
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.params = greedy(10);
  r.params.logprobs = 3;
  r.params.prompt_logprobs = 2;
  auto res = llm.generate({r});
  ASSERT_TRUE(res.ok());
  const auto& o = (*res)[0].outputs[0];
  ASSERT_EQ(o.logprobs.size(), o.token_ids.size());
  for (size_t i = 0; i < o.logprobs.size(); ++i) {
    const auto& lp = o.logprobs[i];
    ASSERT_EQ(lp.top_logprobs.size(), 3u);
    EXPECT_EQ(lp.top_logprobs[0].token, o.token_ids[i]);  // greedy picks the most likely
    EXPECT_FLOAT_EQ(lp.logprob, lp.top_logprobs[0].logprob);
    EXPECT_LE(lp.logprob, 0.0f);
    double mass = 0;
    for (const auto& t : lp.top_logprobs) mass += std::exp(static_cast<double>(t.logprob));
    EXPECT_LE(mass, 1.0 + 1e-5);
  }
  const auto& prompt = (*res)[0].prompt_token_ids;
  ASSERT_EQ((*res)[0].prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i + 1 < prompt.size(); ++i) EXPECT_EQ((*res)[0].prompt_logprobs[i].token, prompt[i + 1]);
}

// --gpu-memory-utilization F: the KV cache gets F x the machine's memory less the weights and
// activations, so raising F by 0.1 adds 0.1 x the memory (to within a block); a fraction that
// leaves less than one sequence is refused, naming what used the memory.
TEST(Engine, GpuMemoryUtilizationGivesTheKvCacheWhatIsLeft) {
  PAGODA_TEST_FILE(model, kModel);
  int64_t total = static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGESIZE);
  if (std::ifstream limit("/sys/fs/cgroup/memory.max"); limit) {
    long long v = 0;
    if (limit >> v && v > 0 && v < total) total = v;
  }
  EngineConfig c;
  c.scheduler.max_model_len = 256;
  c.gpu_memory_utilization = 0.02;
  std::unique_ptr<LLMEngine> low = make_core(model, c);
  c.gpu_memory_utilization = 0.12;
  std::unique_ptr<LLMEngine> high = make_core(model, c);
  ASSERT_TRUE(low && high);
  const double block = static_cast<double>(high->core().kv_cache_bytes() / high->core().num_blocks());
  EXPECT_NEAR(static_cast<double>(high->core().kv_cache_bytes() - low->core().kv_cache_bytes()), 0.1 * static_cast<double>(total),
              2 * block);
  // What is left for it is below the fraction of the machine (the weights took their share).
  EXPECT_LT(static_cast<double>(low->core().kv_cache_bytes()), 0.02 * static_cast<double>(total));
  EXPECT_NE(low->core().kv_cache_summary().find("sized by --gpu-memory-utilization 0.02"), std::string::npos)
      << low->core().kv_cache_summary();
  cpu::register_cpu_backend();
  app::ModelFlags flags;
  flags.model = model;
  auto loaded = app::load_model_and_tokenizer(flags);
  ASSERT_TRUE(loaded.ok());
  c.gpu_memory_utilization = 1e-9;
  auto refused = LLMEngine::create(std::move(loaded->model), std::move(loaded->tokenizer), c);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("--gpu-memory-utilization 1e-09 leaves 0.00 GiB for the KV cache"),
            std::string::npos)
      << refused.status().message();
  c.gpu_memory_utilization = 1.5;
  auto loaded2 = app::load_model_and_tokenizer(flags);
  ASSERT_TRUE(loaded2.ok());
  auto out_of_range = LLMEngine::create(std::move(loaded2->model), std::move(loaded2->tokenizer), c);
  EXPECT_FALSE(out_of_range.ok());
}

TEST(Engine, RejectsWhatCanNeverFitAndKeepsServing) {
  PAGODA_TEST_FILE(model, kModel);
  EngineConfig c;
  c.scheduler.max_model_len = 64;
  LLM llm(make_core(model, c));
  GenerateRequest too_long;
  too_long.prompt = "Once upon a time";
  too_long.params = greedy(100);
  auto bad = llm.generate({too_long});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("maximum context length is 64"), std::string::npos) << bad.status().message();
  GenerateRequest bad_param = too_long;
  bad_param.params = greedy(4);
  bad_param.params.top_p = 2;
  auto bad2 = llm.generate({bad_param});
  ASSERT_FALSE(bad2.ok());
  EXPECT_NE(bad2.status().message().find("top_p"), std::string::npos);
  auto good = llm.generate({"Once upon a time"}, greedy(8));
  ASSERT_TRUE(good.ok());
  EXPECT_EQ((*good)[0].outputs[0].token_ids.size(), 8u);
}

TEST(Engine, ThreadedStreamsAndAbortReturnBlocks) {
  PAGODA_TEST_FILE(model, kModel);
  Engine engine(make_core(model, {}));
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.params = greedy(200);
  r.params.ignore_eos = true;
  // A running request, aborted by dropping its stream after the first chunk.
  {
    auto s = engine.submit(r);
    ASSERT_TRUE(s.ok());
    auto first = s->next(std::chrono::seconds(30));
    ASSERT_TRUE(first.has_value());
  }
  // Queued ones, aborted before they could run much: many at once.
  {
    std::vector<RequestStream> streams;
    for (int i = 0; i < 20; ++i) {
      auto s = engine.submit(r);
      ASSERT_TRUE(s.ok());
      streams.push_back(std::move(*s));
    }
    for (int i = 0; i < 20; i += 2) engine.abort(streams[static_cast<size_t>(i)].id());
  }
  // A normal request still completes, with its text streamed in order.
  GenerateRequest ok = r;
  ok.params = greedy(16);
  auto s = engine.submit(ok);
  ASSERT_TRUE(s.ok());
  std::string text;
  int64_t tokens = 0;
  FinishReason reason = FinishReason::kNone;
  while (auto c = s->next(std::chrono::seconds(30))) {
    text += c->text;
    tokens += static_cast<int64_t>(c->token_ids.size());
    if (c->finished()) reason = c->finish_reason;
  }
  EXPECT_TRUE(s->done());
  EXPECT_EQ(tokens, 16);
  EXPECT_EQ(reason, FinishReason::kLength);
  EXPECT_FALSE(text.empty());
  for (int i = 0; i < 1000 && (engine.stats().num_running + engine.stats().num_waiting) > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine.stats().num_running, 0);
  EXPECT_EQ(engine.stats().num_waiting, 0);
  EXPECT_EQ(engine.stats().kv_usage, 0.0);
}

// The push API the server uses: chunks arrive through the callback in order, the last one
// finished; the queue bound refuses at once; abort_all ends everything; metrics are recorded.
TEST(Engine, CallbacksQueueBoundAbortAllAndMetrics) {
  PAGODA_TEST_FILE(model, kModel);
  auto core = one_at_a_time_core(model);
  ASSERT_TRUE(core);
  auto m = metrics_for(core->core());
  EngineOptions options;
  options.max_queued_requests = 2;
  options.metrics = m;
  Engine engine(std::move(core), options);

  struct Seen {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<OutputChunk> chunks;
    bool finished = false;
  };
  auto submit = [&](GenerateRequest r, std::shared_ptr<Seen> seen) {
    return engine.submit(std::move(r), [seen](OutputChunk&& chunk) {
      std::lock_guard<std::mutex> lock(seen->mu);
      if (chunk.finished()) seen->finished = true;
      seen->chunks.push_back(std::move(chunk));
      seen->cv.notify_all();
    });
  };
  auto wait_finished = [](Seen& seen) {
    std::unique_lock<std::mutex> lock(seen.mu);
    return seen.cv.wait_for(lock, std::chrono::seconds(30), [&] { return seen.finished; });
  };

  GenerateRequest shortr;
  shortr.prompt = "Once upon a time";
  shortr.params = greedy(8);
  shortr.params.ignore_eos = true;
  auto a = std::make_shared<Seen>();
  ASSERT_TRUE(submit(shortr, a).ok());
  ASSERT_TRUE(wait_finished(*a));
  int64_t tokens = 0;
  for (size_t i = 0; i < a->chunks.size(); ++i) {
    tokens += static_cast<int64_t>(a->chunks[i].token_ids.size());
    EXPECT_EQ(a->chunks[i].finished(), i + 1 == a->chunks.size());
  }
  EXPECT_EQ(tokens, 8);
  EXPECT_EQ(m->snapshot().generation_tokens, 8);
  EXPECT_NE(m->render().find("vllm:request_success_total{model_name=\"stories\",engine=\"0\",finished_reason=\"length\"} 1"),
            std::string::npos);

  // One runs (max_num_seqs 1), two wait; the next is refused.
  GenerateRequest longr = shortr;
  longr.params = greedy(1500);
  std::vector<std::shared_ptr<Seen>> held;
  for (int i = 0; i < 3; ++i) {
    held.push_back(std::make_shared<Seen>());
    auto st = submit(longr, held.back());
    ASSERT_TRUE(st.ok()) << st.status().message();
    if (i == 0) {  // wait until it runs: requests not yet taken in count as waiting
      std::unique_lock<std::mutex> lock(held[0]->mu);
      ASSERT_TRUE(held[0]->cv.wait_for(lock, std::chrono::seconds(30), [&] { return !held[0]->chunks.empty(); }));
    }
  }
  Result<RequestId> refused = Status();
  for (int i = 0; i < 500; ++i) {  // until the loop has taken them in and one runs
    refused = submit(shortr, std::make_shared<Seen>());
    if (!refused.ok()) break;
    engine.abort(*refused);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(refused.status().message().find("--max-queued-requests"), std::string::npos);

  engine.abort_all();
  for (auto& h : held) {
    ASSERT_TRUE(wait_finished(*h));
    EXPECT_EQ(h->chunks.back().finish_reason, FinishReason::kAbort);
  }
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_FALSE(engine.health().failed);
  EXPECT_LT(engine.health().seconds_since_progress, 5.0);
  for (int i = 0; i < 200 && engine.stats().kv_usage > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine.stats().kv_usage, 0.0);
  EXPECT_EQ(m->snapshot().running, 0);
}

// The queue bound holds while the loop is busy: requests it has just taken from the queue count
// until the scheduler has decided about them (the loop is held here by the fault-injection hook,
// the way a slow step holds it on a loaded machine).
TEST(Engine, QueueBoundHoldsWhileTheLoopAddsAndSteps) {
  PAGODA_TEST_FILE(model, kModel);
  auto core = one_at_a_time_core(model);
  ASSERT_TRUE(core);
  std::mutex mu;
  std::condition_variable cv;
  int64_t permits = 0;  // steps the hook lets through
  int64_t entered = 0;  // steps that reached the hook
  EngineOptions options;
  options.max_queued_requests = 2;
  options.before_step = [&](int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    ++entered;
    cv.notify_all();
    cv.wait(lock, [&] { return permits > 0 || permits < 0; });
    if (permits > 0) --permits;
  };
  Engine engine(std::move(core), options);
  auto release_all = [&] {
    {
      std::lock_guard<std::mutex> lock(mu);
      permits = -1;  // let every step through
    }
    cv.notify_all();
  };
  struct OnExit {  // an early ASSERT return must not leave the engine thread held
    std::function<void()> f;
    ~OnExit() { f(); }
  } on_exit{release_all};
  auto wait_entered = [&](int64_t n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(30), [&] { return entered >= n; });
  };
  auto ignore = [](OutputChunk&&) {};
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.params = greedy(50);
  r.params.ignore_eos = true;

  {
    std::lock_guard<std::mutex> lock(mu);
    permits = 1;  // step 0: the first request is scheduled and runs (max_num_seqs 1)
  }
  ASSERT_TRUE(engine.submit(r, ignore).ok());
  ASSERT_TRUE(wait_entered(2));                // step 1 held
  ASSERT_TRUE(engine.submit(r, ignore).ok());  // these two wait in the queue
  ASSERT_TRUE(engine.submit(r, ignore).ok());
  EXPECT_EQ(engine.submit(r, ignore).status().code(), StatusCode::kResourceExhausted);
  {
    std::lock_guard<std::mutex> lock(mu);
    permits = 1;  // step 1 runs; the loop then adds the two to the scheduler and holds at step 2
  }
  cv.notify_all();
  ASSERT_TRUE(wait_entered(3));
  EXPECT_EQ(engine.submit(r, ignore).status().code(), StatusCode::kResourceExhausted);
  release_all();
  engine.abort_all();
  for (int i = 0; i < 3000 && engine.num_unfinished() > 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine.num_unfinished(), 0);
}

// A step that throws: the running request and those waiting behind it all end with finish
// reason error (and are counted so); the engine reports the failure and refuses new work.
TEST(Engine, FailedStepEndsEveryRequestWithAnError) {
  PAGODA_TEST_FILE(model, kModel);
  auto core = one_at_a_time_core(model);
  ASSERT_TRUE(core);
  auto m = metrics_for(core->core());
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  EngineOptions options;
  options.metrics = m;
  options.before_step = [&](int64_t step) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return go; });  // until every request is submitted
    if (step == 3) throw std::runtime_error("injected fault at step 3");
  };
  Engine engine(std::move(core), options);
  std::vector<std::vector<OutputChunk>> seen(3);
  std::vector<bool> finished(3, false);
  GenerateRequest r;
  r.prompt = "Once upon a time";
  r.params = greedy(50);
  r.params.ignore_eos = true;
  for (size_t i = 0; i < 3; ++i) {
    auto st = engine.submit(r, [&, i](OutputChunk&& chunk) {
      std::lock_guard<std::mutex> lock(mu);
      finished[i] = finished[i] || chunk.finished();
      seen[i].push_back(std::move(chunk));
      cv.notify_all();
    });
    ASSERT_TRUE(st.ok()) << st.status().message();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_all();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished[0] && finished[1] && finished[2]; }));
    for (size_t i = 0; i < 3; ++i) EXPECT_EQ(seen[i].back().finish_reason, FinishReason::kError) << i;
    EXPECT_GT(seen[0].size(), 1u);  // the first ran (3 steps) before the fault
  }
  const EngineHealth h = engine.health();
  EXPECT_TRUE(h.failed);
  EXPECT_NE(h.error.find("injected fault at step 3"), std::string::npos) << h.error;
  Result<RequestId> after = engine.submit(r, [](OutputChunk&&) {});
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_NE(m->render().find("vllm:request_success_total{model_name=\"stories\",engine=\"0\",finished_reason=\"error\"} 3"),
            std::string::npos)
      << m->render();
}

// Data parallelism: two cores behind one Engine. Requests go to the less loaded core (here, with
// both loops held before their first step, strictly in turn), keep their outputs (each equals one
// engine's run of the same prompt), and an abort finds its request on its core; the metrics say
// which core served what.
TEST(Engine, DataParallelCoresTakeRequestsInTurnAndKeepOutputs) {
  PAGODA_TEST_FILE(model, kModel);
  auto rs = requests_for(stories_prompts(8), greedy(24));
  std::vector<std::vector<TokenId>> expected;
  {
    LLM llm(make_core(model, {}));
    auto out = llm.generate(rs);
    ASSERT_TRUE(out.ok()) << out.status().message();
    for (const auto& o : *out) expected.push_back(o.outputs[0].token_ids);
  }
  std::vector<std::unique_ptr<LLMEngine>> cores;
  cores.push_back(one_at_a_time_core(model));
  cores.push_back(one_at_a_time_core(model));
  ASSERT_TRUE(cores[0] && cores[1]);
  metrics::CacheConfigInfo info;
  info.block_size = cores[0]->core().config().block_size;
  info.num_blocks = cores[0]->core().num_blocks();
  auto m = std::make_shared<metrics::EngineMetrics>("stories", info, cores[0]->core().config().scheduler.max_model_len, 2);
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  EngineOptions options;
  options.metrics = m;
  options.before_step = [&](int64_t) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return go; });
  };
  Engine engine(std::move(cores), options);
  ASSERT_EQ(engine.num_replicas(), 2);
  std::vector<std::vector<TokenId>> tokens(rs.size());
  std::vector<FinishReason> reasons(rs.size(), FinishReason::kNone);
  std::vector<RequestId> ids;
  for (size_t i = 0; i < rs.size(); ++i) {
    auto id = engine.submit(rs[i], [&, i](OutputChunk&& c) {
      std::lock_guard<std::mutex> lock(mu);
      tokens[i].insert(tokens[i].end(), c.token_ids.begin(), c.token_ids.end());
      if (c.finished()) reasons[i] = c.finish_reason;
      cv.notify_all();
    });
    ASSERT_TRUE(id.ok()) << id.status().message();
    ids.push_back(*id);
  }
  // Request 5 went to core 1 (the odd ones did), where it waits behind 1 and 3.
  engine.abort(ids[5]);
  {
    std::lock_guard<std::mutex> lock(mu);
    go = true;
  }
  cv.notify_all();
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(60), [&] {
      return std::all_of(reasons.begin(), reasons.end(), [](FinishReason r) { return r != FinishReason::kNone; });
    }));
  }
  for (size_t i = 0; i < rs.size(); ++i) {
    if (i == 5) {
      EXPECT_EQ(reasons[i], FinishReason::kAbort);
      EXPECT_TRUE(tokens[i].empty());
      continue;
    }
    EXPECT_EQ(reasons[i], FinishReason::kLength) << i;
    EXPECT_EQ(tokens[i], expected[i]) << "prompt " << i;
  }
  const std::string text = m->render();
  EXPECT_NE(text.find("vllm:request_success_total{model_name=\"stories\",engine=\"0\",finished_reason=\"length\"} 4"),
            std::string::npos) << text;
  EXPECT_NE(text.find("vllm:request_success_total{model_name=\"stories\",engine=\"1\",finished_reason=\"length\"} 3"),
            std::string::npos) << text;
  EXPECT_NE(text.find("vllm:request_success_total{model_name=\"stories\",engine=\"1\",finished_reason=\"abort\"} 1"),
            std::string::npos) << text;
  EXPECT_NE(text.find("vllm:generation_tokens_total{model_name=\"stories\",engine=\"0\"} 96"), std::string::npos) << text;
  EXPECT_NE(text.find("vllm:generation_tokens_total{model_name=\"stories\",engine=\"1\"} 72"), std::string::npos) << text;
  EXPECT_EQ(m->snapshot().generation_tokens, 168);
  EXPECT_EQ(m->snapshot(1).generation_tokens, 72);
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_GT(engine.stats(1).prefix_cache.queries, 0);
  EXPECT_EQ(engine.stats().prefix_cache.queries,
            engine.stats(0).prefix_cache.queries + engine.stats(1).prefix_cache.queries);
}

}  // namespace
}  // namespace pagoda
