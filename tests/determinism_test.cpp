// The determinism suite (issue 7, section 4): a probe request gets the same tokens whatever
// happens around it. For a greedy probe and a seeded sampling probe (temperature 0.8, top-p
// 0.9), each is compared with its output alone in a fresh engine:
//  - again in another fresh engine (the same across runs);
//  - among 63 other requests of random lengths, at random positions in the batch;
//  - with prefix caching on after a request that shares its first blocks (cache hit), and off;
//  - with chunked prefill (8 tokens a step);
//  - in a KV cache so small that requests are preempted and recomputed;
//  - through the threaded Engine's stream (what the server sends, streamed or not);
//  - with speculative decoding (n-gram, a q4_0 copy of the model as the draft, the model as its
//    own draft) in a batch, after a prefix-cache hit, with chunked prefill and preemption.
// Run on stories260K (a trained model; GQA group of 2: one query vector at a time), on a
// dummy q8_0 model with a GQA group of 8 (packed int8 matmul, query heads across the lanes), and
// on a dummy q4_0 mixture of experts (Qwen3-MoE, 4 of 16 experts a token: which tokens share an
// expert changes with the batch, a token's result must not);
// determinism_types_test.cpp runs the same on every weight type and KV cache type, on every CPU
// kernel table the CPU can run.
// Where a kernel's reduction order depended on the batch, this is where it shows.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "determinism_check.h"

namespace pagoda {
namespace {

using determinism::check_model;

TEST(Determinism, Stories260K) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  app::ModelFlags flags;
  flags.model = model;
  check_model(flags, 5 * 2 * 4 * 8 * 4, KvCacheDtype::kF32, "auto", /*speculative=*/true);
}

TEST(Determinism, DummyQ8GroupOf8) {
  PAGODA_TEST_FILE(tokenizer, "stories260K/stories260K.gguf");
  const std::string dir = testing::make_temp_dir();
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir + "/config.json") << determinism::kDummyConfig;
  app::ModelFlags flags;
  flags.model = dir;
  flags.load_format = "dummy";
  flags.dtype = "q8_0";
  flags.tokenizer = tokenizer;
  check_model(flags, 2 * 2 * 1 * 32 * 4, KvCacheDtype::kF32, "auto", /*speculative=*/true);
  std::filesystem::remove_all(dir);
}

TEST(Determinism, DummyQwen3MoeQ4_0) {
  PAGODA_TEST_FILE(tokenizer, "stories260K/stories260K.gguf");
  const std::string dir = testing::make_temp_dir();
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir + "/config.json") << R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 128,
      "intermediate_size": 256, "moe_intermediate_size": 64, "num_experts": 16, "num_experts_per_tok": 4,
      "norm_topk_prob": true, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
      "rope_theta": 1000000.0, "tie_word_embeddings": false})";
  app::ModelFlags flags;
  flags.model = dir;
  flags.load_format = "dummy";
  flags.dtype = "q4_0";
  flags.tokenizer = tokenizer;
  check_model(flags, 2 * 2 * 2 * 32 * 4, KvCacheDtype::kF32, "auto", /*speculative=*/true);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pagoda
