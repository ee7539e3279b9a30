// The determinism suite's check (issue 7, section 4), shared by determinism_test.cpp and
// determinism_types_test.cpp: check_model runs a greedy and a seeded probe of a model in every
// situation the suite covers and compares each with its output alone in a fresh engine.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/llm.h"
#include "support/engine_core.h"
#include "support/test_data.h"

namespace pagoda::determinism {

// The dummy model's config.json: Llama, 2 layers, hidden 256, feed-forward 512, 8 query heads
// over 1 KV head (a GQA group of 8: query heads across the lanes), stories260K's vocabulary.
inline constexpr const char* kDummyConfig = R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 1, "vocab_size": 512, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0})";

inline constexpr int64_t kVocab = 512;  // stories260K's; the dummy model uses its tokenizer

inline std::unique_ptr<LLMEngine> make_core(const app::ModelFlags& flags, const EngineConfig& config,
                                             const std::string& isa = "auto") {
  return testing::make_engine_core(flags, config, isa);
}

// An engine that speculates: with the n-gram proposer (draft_dtype empty), or with a draft model
// loaded from `flags` with --dtype draft_dtype ("auto": the model itself as its own draft).
inline std::unique_ptr<LLMEngine> make_spec_core(const app::ModelFlags& flags, EngineConfig config,
                                                  const std::string& draft_dtype, const std::string& isa) {
  if (draft_dtype.empty()) {
    config.speculative = SpeculativeConfig{"ngram", 3, 1, 3, 0, "", ""};
    return make_core(flags, config, isa);
  }
  cpu::register_cpu_backend(cpu::CpuBackendOptions{.isa = isa});
  app::ModelFlags draft_flags = flags;
  draft_flags.dtype = draft_dtype;
  auto target = app::load_model_and_tokenizer(flags);
  auto draft = app::load_model_and_tokenizer(draft_flags);
  EXPECT_TRUE(target.ok() && draft.ok());
  if (!target.ok() || !draft.ok()) return nullptr;
  config.speculative = SpeculativeConfig{"draft_model", 3, 0, 0, 0, flags.model, ""};
  auto core = LLMEngine::create(std::move(target->model), std::move(target->tokenizer), config,
                                 std::move(draft->model));
  EXPECT_TRUE(core.ok()) << core.status().message();
  return core.ok() ? std::move(*core) : nullptr;
}

inline std::vector<TokenId> random_ids(std::mt19937& rng, size_t n) {
  std::uniform_int_distribution<TokenId> id(3, kVocab - 1);  // past <unk>, <s>, </s>
  std::vector<TokenId> ids = {1};                            // BOS first, as the tokenizer does
  while (ids.size() < n) ids.push_back(id(rng));
  return ids;
}

inline GenerateRequest request(std::vector<TokenId> prompt, int64_t max_tokens, std::optional<uint64_t> seed) {
  GenerateRequest r;
  r.prompt_token_ids = std::move(prompt);
  r.params.max_tokens = max_tokens;
  r.params.ignore_eos = true;
  if (seed) {
    r.params.temperature = 0.8;
    r.params.top_p = 0.9;
    r.params.seed = seed;
  } else {
    r.params.temperature = 0;
  }
  return r;
}

inline std::vector<TokenId> run_one(LLM& llm, const GenerateRequest& r) {
  auto out = llm.generate(std::vector<GenerateRequest>{r});
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? (*out)[0].outputs[0].token_ids : std::vector<TokenId>{};
}

// kv_bytes_per_token: layers x 2 (K, V) x kv heads x (head size x the cache type's bytes, + 4 for
// an int8 cache's scale). Every engine runs on the CPU kernel table `isa`. speculative: also
// with speculative decoding (n-gram, and a q4_0 copy of the model or the model itself as the
// draft), among other requests, with a prefix-cache hit, chunked prefill and preemption.
inline void check_model(const app::ModelFlags& flags, int64_t kv_bytes_per_token, KvCacheDtype kv_dtype = KvCacheDtype::kF32,
                        const std::string& isa = "auto", bool speculative = false) {
  EngineConfig base;
  base.kv_cache_dtype = kv_dtype;
  base.scheduler.max_model_len = 256;  // within both models' context
  std::mt19937 rng(2026);
  // Three blocks and a bit of shared prefix for the cache case.
  const std::vector<TokenId> prompt = random_ids(rng, 53);
  const std::vector<GenerateRequest> probes = {request(prompt, 24, std::nullopt), request(prompt, 24, 42)};

  std::vector<std::vector<TokenId>> baseline;
  {
    LLM llm(make_core(flags, base, isa));
    for (const auto& p : probes) baseline.push_back(run_one(llm, p));
  }
  for (size_t k = 0; k < probes.size(); ++k) {
    SCOPED_TRACE(k == 0 ? "greedy probe" : "seeded probe");
    ASSERT_EQ(baseline[k].size(), 24u);

    {  // Another run, another engine.
      LLM llm(make_core(flags, base, isa));
      EXPECT_EQ(run_one(llm, probes[k]), baseline[k]) << "second run";
    }
    {  // 1 of 64 concurrent requests, at three random positions.
      LLM llm(make_core(flags, base, isa));
      std::uniform_int_distribution<size_t> len(1, 90), out(1, 40);
      std::vector<GenerateRequest> batch;
      for (int i = 0; i < 63; ++i) {
        batch.push_back(request(random_ids(rng, len(rng)), static_cast<int64_t>(out(rng)),
                                i % 2 == 0 ? std::nullopt : std::optional<uint64_t>(7 + i)));
      }
      for (size_t at : {size_t{0}, std::uniform_int_distribution<size_t>(1, 62)(rng), size_t{63}}) {
        std::vector<GenerateRequest> rs = batch;
        rs.insert(rs.begin() + static_cast<std::ptrdiff_t>(at), probes[k]);
        auto res = llm.generate(rs);
        ASSERT_TRUE(res.ok()) << res.status().message();
        EXPECT_EQ((*res)[at].outputs[0].token_ids, baseline[k]) << "at position " << at << " of 64";
      }
    }
    {  // Prefix cache: a hit on the probe's first 3 blocks, and caching off.
      LLM cached(make_core(flags, base, isa));
      std::vector<TokenId> sibling(prompt.begin(), prompt.begin() + 50);
      sibling.push_back(5);
      run_one(cached, request(sibling, 4, std::nullopt));
      auto res = cached.generate(std::vector<GenerateRequest>{probes[k]});
      ASSERT_TRUE(res.ok());
      EXPECT_EQ((*res)[0].cached_tokens, 48);
      EXPECT_EQ((*res)[0].outputs[0].token_ids, baseline[k]) << "prefix cache hit";
      EngineConfig off = base;
      off.enable_prefix_caching = false;
      LLM uncached(make_core(flags, off, isa));
      EXPECT_EQ(run_one(uncached, probes[k]), baseline[k]) << "prefix caching off";
    }
    {  // Chunked prefill, 8 tokens a step, beside other requests.
      EngineConfig small = base;
      small.scheduler.max_num_batched_tokens = 8;
      LLM llm(make_core(flags, small, isa));
      std::vector<GenerateRequest> rs = {request(random_ids(rng, 30), 10, std::nullopt), probes[k],
                                         request(random_ids(rng, 20), 30, 3)};
      auto res = llm.generate(rs);
      ASSERT_TRUE(res.ok());
      EXPECT_EQ((*res)[1].outputs[0].token_ids, baseline[k]) << "chunked prefill";
    }
    {  // Preempted: 48 blocks of 4 tokens for 8 requests that need 20 each at the end.
      EngineConfig tight = base;
      tight.block_size = 4;
      tight.scheduler.max_model_len = 128;
      tight.kv_cache_memory = 48 * tight.block_size * kv_bytes_per_token;
      LLM llm(make_core(flags, tight, isa));
      std::vector<GenerateRequest> rs;
      for (int i = 0; i < 7; ++i) rs.push_back(request(random_ids(rng, 50), 30, std::nullopt));
      rs.push_back(probes[k]);
      auto res = llm.generate(rs);
      ASSERT_TRUE(res.ok()) << res.status().message();
      EXPECT_GT(llm.core().stats().num_preemptions, 0);
      EXPECT_EQ((*res)[7].outputs[0].token_ids, baseline[k]) << "preempted";
    }
    for (const char* draft_type : {"", "q4_0", "auto"}) {
      const std::string draft = draft_type;
      if (!speculative) break;
      SCOPED_TRACE(draft.empty() ? "ngram" : "draft model, --dtype " + draft);
      {  // 1 of 16 concurrent requests; then after a sibling that leaves 3 blocks cached.
        LLM llm(make_spec_core(flags, base, draft, isa));
        std::uniform_int_distribution<size_t> len(1, 90), out(1, 40);
        std::vector<GenerateRequest> rs;
        for (int i = 0; i < 15; ++i) {
          rs.push_back(request(random_ids(rng, len(rng)), static_cast<int64_t>(out(rng)),
                               i % 2 == 0 ? std::nullopt : std::optional<uint64_t>(11 + i)));
        }
        rs.insert(rs.begin() + 5, probes[k]);
        auto res = llm.generate(rs);
        ASSERT_TRUE(res.ok()) << res.status().message();
        EXPECT_EQ((*res)[5].outputs[0].token_ids, baseline[k]) << "speculative, in a batch";
        std::vector<TokenId> sibling(prompt.begin(), prompt.begin() + 50);
        sibling.push_back(5);
        run_one(llm, request(sibling, 4, std::nullopt));
        auto hit = llm.generate(std::vector<GenerateRequest>{probes[k]});
        ASSERT_TRUE(hit.ok());
        EXPECT_GE((*hit)[0].cached_tokens, 48);
        EXPECT_EQ((*hit)[0].outputs[0].token_ids, baseline[k]) << "speculative, prefix cache hit";
        EXPECT_GT(llm.core().spec_stats().num_drafts, 0);
      }
      {  // Chunks of 12 prompt tokens, and preempted: 60 blocks of 4 for 8 requests of 80 tokens.
        EngineConfig tight = base;
        tight.block_size = 4;
        tight.scheduler.max_model_len = 128;
        tight.scheduler.long_prefill_token_threshold = 12;
        tight.kv_cache_memory = 60 * tight.block_size * kv_bytes_per_token * (draft.empty() ? 1 : 2);
        LLM llm(make_spec_core(flags, tight, draft, isa));
        std::vector<GenerateRequest> rs;
        for (int i = 0; i < 7; ++i) rs.push_back(request(random_ids(rng, 50), 30, std::nullopt));
        rs.push_back(probes[k]);
        auto res = llm.generate(rs);
        ASSERT_TRUE(res.ok()) << res.status().message();
        EXPECT_GT(llm.core().stats().num_preemptions, 0);
        EXPECT_EQ((*res)[7].outputs[0].token_ids, baseline[k]) << "speculative, chunked prefill, preempted";
      }
    }
    {  // The threaded Engine, as the server drives it: the stream's tokens.
      Engine engine(make_core(flags, base, isa));
      auto s = engine.submit(probes[k]);
      ASSERT_TRUE(s.ok());
      std::vector<TokenId> streamed;
      while (auto c = s->next(std::chrono::seconds(60))) {
        streamed.insert(streamed.end(), c->token_ids.begin(), c->token_ids.end());
      }
      EXPECT_EQ(streamed, baseline[k]) << "engine stream";
    }
  }
}

}  // namespace pagoda::determinism
