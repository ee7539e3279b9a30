// The determinism suite (issue 7, section 4): a probe request gets the same tokens whatever
// happens around it. For a greedy probe and a seeded sampling probe (temperature 0.8, top-p
// 0.9), each is compared with its output alone in a fresh engine:
//  - again in another fresh engine (the same across runs);
//  - among 63 other requests of random lengths, at random positions in the batch;
//  - with prefix caching on after a request that shares its first blocks (cache hit), and off;
//  - with chunked prefill (8 tokens a step);
//  - in a KV cache so small that requests are preempted and recomputed;
//  - through the threaded Engine's stream (what the server sends, streamed or not).
// Run on stories260K (a trained model; GQA group of 2: one query vector at a time) and on a
// dummy model with a GQA group of 8 (query heads across the lanes) in every quantized weight type
// (each GGUF block type, W8A8 and W4A8) and with the fp8 / int8 KV caches. Where a kernel's
// reduction order depended on the batch, this is where it shows.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <ostream>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/llm.h"
#include "support/engine_core.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

constexpr int64_t kVocab = 512;  // stories260K's; the dummy model uses its tokenizer

std::unique_ptr<EngineCore> make_core(const app::ModelFlags& flags, const EngineConfig& config) {
  return testing::make_engine_core(flags, config);
}

std::vector<TokenId> random_ids(std::mt19937& rng, size_t n) {
  std::uniform_int_distribution<TokenId> id(3, kVocab - 1);  // past <unk>, <s>, </s>
  std::vector<TokenId> ids = {1};                            // BOS first, as the tokenizer does
  while (ids.size() < n) ids.push_back(id(rng));
  return ids;
}

GenerateRequest request(std::vector<TokenId> prompt, int64_t max_tokens, std::optional<uint64_t> seed) {
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

std::vector<TokenId> run_one(LLM& llm, const GenerateRequest& r) {
  auto out = llm.generate(std::vector<GenerateRequest>{r});
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? (*out)[0].outputs[0].token_ids : std::vector<TokenId>{};
}

// kv_bytes_per_token: layers x 2 (K, V) x kv heads x (head size x the cache type's bytes, + 4 for
// an int8 cache's scale).
void check_model(const app::ModelFlags& flags, int64_t kv_bytes_per_token, KvCacheDtype kv_dtype = KvCacheDtype::kF32) {
  EngineConfig base;
  base.kv_cache_dtype = kv_dtype;
  base.scheduler.max_model_len = 256;  // within both models' context
  std::mt19937 rng(2026);
  // Three blocks and a bit of shared prefix for the cache case.
  const std::vector<TokenId> prompt = random_ids(rng, 53);
  const std::vector<GenerateRequest> probes = {request(prompt, 24, std::nullopt), request(prompt, 24, 42)};

  std::vector<std::vector<TokenId>> baseline;
  {
    LLM llm(make_core(flags, base));
    for (const auto& p : probes) baseline.push_back(run_one(llm, p));
  }
  for (size_t k = 0; k < probes.size(); ++k) {
    SCOPED_TRACE(k == 0 ? "greedy probe" : "seeded probe");
    ASSERT_EQ(baseline[k].size(), 24u);

    {  // Another run, another engine.
      LLM llm(make_core(flags, base));
      EXPECT_EQ(run_one(llm, probes[k]), baseline[k]) << "second run";
    }
    {  // 1 of 64 concurrent requests, at three random positions.
      LLM llm(make_core(flags, base));
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
      LLM cached(make_core(flags, base));
      std::vector<TokenId> sibling(prompt.begin(), prompt.begin() + 50);
      sibling.push_back(5);
      run_one(cached, request(sibling, 4, std::nullopt));
      auto res = cached.generate(std::vector<GenerateRequest>{probes[k]});
      ASSERT_TRUE(res.ok());
      EXPECT_EQ((*res)[0].cached_tokens, 48);
      EXPECT_EQ((*res)[0].outputs[0].token_ids, baseline[k]) << "prefix cache hit";
      EngineConfig off = base;
      off.enable_prefix_caching = false;
      LLM uncached(make_core(flags, off));
      EXPECT_EQ(run_one(uncached, probes[k]), baseline[k]) << "prefix caching off";
    }
    {  // Chunked prefill, 8 tokens a step, beside other requests.
      EngineConfig small = base;
      small.scheduler.max_num_batched_tokens = 8;
      LLM llm(make_core(flags, small));
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
      LLM llm(make_core(flags, tight));
      std::vector<GenerateRequest> rs;
      for (int i = 0; i < 7; ++i) rs.push_back(request(random_ids(rng, 50), 30, std::nullopt));
      rs.push_back(probes[k]);
      auto res = llm.generate(rs);
      ASSERT_TRUE(res.ok()) << res.status().message();
      EXPECT_GT(llm.core().stats().num_preemptions, 0);
      EXPECT_EQ((*res)[7].outputs[0].token_ids, baseline[k]) << "preempted";
    }
    {  // The threaded Engine, as the server drives it: the stream's tokens.
      Engine engine(make_core(flags, base));
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

TEST(Determinism, Stories260K) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  app::ModelFlags flags;
  flags.model = model;
  check_model(flags, 5 * 2 * 4 * 8 * 4);
}

// The dummy model in one weight type (--dtype, or --quantization on bf16 weights) and KV cache type.
struct DummyCase {
  const char* dtype;
  const char* quantization;
  KvCacheDtype kv = KvCacheDtype::kF32;
};

void PrintTo(const DummyCase& c, std::ostream* os) {
  *os << c.dtype << (*c.quantization ? " --quantization " : "") << c.quantization << ", KV cache "
      << kv_cache_dtype_name(c.kv);
}

class DeterminismDummy : public ::testing::TestWithParam<DummyCase> {};

TEST_P(DeterminismDummy, GroupOf8) {
  PAGODA_TEST_FILE(tokenizer, "stories260K/stories260K.gguf");
  const DummyCase& c = GetParam();
  const std::string dir = testing::make_temp_dir();
  ASSERT_FALSE(dir.empty());
  // Rows of 256 and 512: every K-quant applies as it is.
  std::ofstream(dir + "/config.json") << R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 1, "vocab_size": 512, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-5, "rope_theta": 10000.0})";
  app::ModelFlags flags;
  flags.model = dir;
  flags.load_format = "dummy";
  flags.dtype = c.dtype;
  flags.quantization = c.quantization;
  flags.tokenizer = tokenizer;
  const int64_t head_bytes = c.kv == KvCacheDtype::kF32 ? 32 * 4 : c.kv == KvCacheDtype::kInt8 ? 32 + 4 : 32;
  check_model(flags, 2 * 2 * 1 * head_bytes, c.kv);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    EveryType, DeterminismDummy,
    ::testing::Values(DummyCase{"q8_0", ""}, DummyCase{"q4_0", ""}, DummyCase{"q4_1", ""}, DummyCase{"q5_0", ""},
                      DummyCase{"q5_1", ""}, DummyCase{"q2_k", ""}, DummyCase{"q3_k", ""}, DummyCase{"q4_k", ""},
                      DummyCase{"q5_k", ""}, DummyCase{"q6_k", ""}, DummyCase{"bfloat16", "w8a8"},
                      DummyCase{"bfloat16", "w4a8"}, DummyCase{"q8_0", "", KvCacheDtype::kInt8},
                      DummyCase{"q8_0", "", KvCacheDtype::kFp8E4M3}),
    [](const ::testing::TestParamInfo<DummyCase>& info) {
      std::string name = std::string(info.param.dtype) + "_" + info.param.quantization + "_" +
                         std::string(kv_cache_dtype_name(info.param.kv));
      for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
      return name;
    });

}  // namespace
}  // namespace pagoda
