#include "loader/model_config.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "loader/config_parsers.h"
#include "loader/gguf_writer.h"
#include "loader/loader_test_util.h"
#include "loader/model_source.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

ModelConfig small_config() {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 100;
  c.hidden_size = 64;
  c.intermediate_size = 128;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  return c;
}

TEST(ModelConfig, Validate) {
  EXPECT_TRUE(small_config().validate("x").ok());
  auto expect_bad = [](ModelConfig c, const std::string& needle) {
    Status s = c.validate("cfg.json");
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_EQ(s.message().rfind("cfg.json: ", 0), 0u) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  };
  ModelConfig c = small_config();
  c.num_kv_heads = 3;
  expect_bad(c, "not a multiple of num_kv_heads");
  c = small_config();
  c.num_kv_heads = 8;
  expect_bad(c, "num_kv_heads");
  c = small_config();
  c.head_dim = 15;
  expect_bad(c, "odd");
  c = small_config();
  c.vocab_size = 0;
  expect_bad(c, "vocab_size");
  c = small_config();
  c.vocab_size = (int64_t{1} << 24) + 1;
  expect_bad(c, "vocab_size");
  c = small_config();
  c.hidden_size = int64_t{1} << 40;
  expect_bad(c, "hidden_size");
  c = small_config();
  c.num_layers = 1025;
  expect_bad(c, "num_layers");
  c = small_config();
  c.num_heads = -4;
  expect_bad(c, "num_heads");
  c = small_config();
  c.rms_norm_eps = 0;
  expect_bad(c, "rms_norm_eps");
  c = small_config();
  c.rope_theta = NAN;
  expect_bad(c, "rope_theta");
  c = small_config();
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.high_freq_factor = 1;  // == low
  expect_bad(c, "llama3");
  c = small_config();
  c.rope_scaling.type = RopeScaling::Type::kYarn;
  c.rope_scaling.factor = 4;
  c.rope_scaling.beta_slow = 40;  // above beta_fast
  expect_bad(c, "yarn");
  c = small_config();
  c.architecture = "";
  expect_bad(c, "architecture");
}

TEST(ModelConfig, NumParameters) {
  // Known totals of the real models.
  EXPECT_NEAR(static_cast<double>(dummy_preset("tinyllama-1.1b")->num_parameters()), 1.100e9, 0.001e9);
  EXPECT_NEAR(static_cast<double>(dummy_preset("qwen2.5-0.5b")->num_parameters()), 0.494e9, 0.001e9);
  EXPECT_NEAR(static_cast<double>(dummy_preset("qwen3-0.6b")->num_parameters()), 0.596e9, 0.001e9);
  EXPECT_NEAR(static_cast<double>(dummy_preset("llama-3.2-1b")->num_parameters()), 1.236e9, 0.001e9);
  // The mixtures of experts: all parameters and those a token reads (the model cards' figures).
  EXPECT_NEAR(static_cast<double>(dummy_preset("qwen3-30b-a3b")->num_parameters()), 30.5e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(dummy_preset("qwen3-30b-a3b")->num_active_parameters()), 3.3e9, 0.06e9);
  EXPECT_NEAR(static_cast<double>(dummy_preset("qwen1.5-moe-a2.7b")->num_parameters()), 14.3e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(dummy_preset("qwen1.5-moe-a2.7b")->num_active_parameters()), 2.7e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(dummy_preset("mixtral-8x7b")->num_parameters()), 46.7e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(dummy_preset("mixtral-8x7b")->num_active_parameters()), 12.9e9, 0.05e9);
  // It agrees with the tensor list.
  for (const std::string& name : dummy_presets()) {
    ModelConfig c = *dummy_preset(name);
    int64_t total = 0;
    for (const WeightSpec& s : expected_weights(c)) {
      int64_t n = 1;
      for (int64_t d : s.shape) n *= d;
      total += n;
    }
    EXPECT_EQ(total, c.num_parameters()) << name;
  }
}

// ---- config.json --------------------------------------------------------------------------

constexpr const char* kLlama32Json = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "attention_bias": false,
  "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 2048, "intermediate_size": 8192, "max_position_embeddings": 131072,
  "mlp_bias": false, "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
  "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": true,
  "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "torch_dtype": "bfloat16", "vocab_size": 128256})";

TEST(ConfigFromHf, Llama32) {
  auto r = config_from_hf_json(kLlama32Json, "config.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_EQ(c.hidden_size, 2048);
  EXPECT_EQ(c.intermediate_size, 8192);
  EXPECT_EQ(c.num_layers, 16);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.max_position_embeddings, 131072);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.rope_interleaved);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.sliding_window, 0);
}

// Qwen2.5's YaRN (its model card's rope_scaling), dynamic NTK, and refusals.
TEST(ConfigFromHf, YarnAndDynamicRopeScaling) {
  const std::string head = R"({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 32768,
      "rope_scaling": )";
  auto with = [&](const std::string& rs) { return config_from_hf_json(head + rs + "}", "dir/config.json"); };
  auto yarn = with(R"({"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"})");
  ASSERT_TRUE(yarn.ok()) << yarn.status().message();
  EXPECT_EQ(yarn->rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_DOUBLE_EQ(yarn->rope_scaling.factor, 4.0);
  EXPECT_EQ(yarn->rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(yarn->rope_scaling.beta_fast, 32);
  EXPECT_DOUBLE_EQ(yarn->rope_scaling.beta_slow, 1);
  const double m = 0.1 * std::log(4.0) + 1;
  EXPECT_NEAR(yarn->rope_scaling.attention_scale(), m * m, 1e-12);
  auto given = with(R"({"rope_type": "yarn", "factor": 2.0, "beta_fast": 16, "beta_slow": 2, "attention_factor": 1.5})");
  ASSERT_TRUE(given.ok()) << given.status().message();
  EXPECT_EQ(given->rope_scaling.original_max_position_embeddings, 32768);  // the model's, by default
  EXPECT_DOUBLE_EQ(given->rope_scaling.attention_scale(), 2.25);
  EXPECT_EQ(yarn->max_context_len(), 4 * 32768);  // vLLM's derived max_model_len
  auto dynamic = with(R"({"type": "dynamic", "factor": 2.0})");
  ASSERT_TRUE(dynamic.ok()) << dynamic.status().message();
  EXPECT_EQ(dynamic->rope_scaling.type, RopeScaling::Type::kDynamic);
  EXPECT_DOUBLE_EQ(dynamic->rope_scaling.attention_scale(), 1.0);
  EXPECT_EQ(dynamic->max_context_len(), 2 * 32768);
  auto plain_config = config_from_hf_json(head + "null}", "dir/config.json");
  ASSERT_TRUE(plain_config.ok()) << plain_config.status().message();
  EXPECT_EQ(plain_config->max_context_len(), 32768);
  auto deepseek = with(R"({"type": "yarn", "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0})");
  ASSERT_FALSE(deepseek.ok());
  EXPECT_NE(deepseek.status().message().find("mscale"), std::string::npos);
  auto unknown = with(R"({"type": "longrope", "factor": 2.0})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("longrope"), std::string::npos);
}

// compressed-tensors' quantization_config (shared/docs/quantization-formats.md 4.1): int8 W8A8
// with per-token or static activations is read; other methods and formats are refused naming the
// file, the field and what it holds.
TEST(ConfigFromHf, CompressedTensorsW8A8) {
  const std::string head = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "quantization_config": )";
  auto with = [&](const std::string& q) { return config_from_hf_json(head + q + "}", "dir/config.json"); };
  const std::string dynamic = R"({"quant_method": "compressed-tensors", "format": "int-quantized",
      "quantization_status": "compressed", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel", "dynamic": false},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": true, "strategy": "token", "dynamic": true}}}})";
  auto d = with(dynamic);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->quantization.method, "compressed-tensors");
  EXPECT_FALSE(d->quantization.static_input_scales);
  std::string fixed = dynamic;
  fixed.replace(fixed.find(R"("strategy": "token", "dynamic": true)"), 36, R"("strategy": "tensor", "dynamic": false)");
  auto s = with(fixed);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(s->quantization.static_input_scales);
  EXPECT_TRUE(config_from_hf_json(head + "null}", "c.json").ok());  // no quantization
  EXPECT_EQ(config_from_hf_json(head + "null}", "c.json")->quantization.method, "");

  const struct {
    std::string from, to, message;
  } kRefused[] = {
      {R"("quant_method": "compressed-tensors")", R"("quant_method": "bitsandbytes")",
       "dir/config.json: quantization_config: quant_method bitsandbytes is not supported yet"},
      {R"("format": "int-quantized")", R"("format": "float-quantized")",
       "compressed-tensors format float-quantized is not supported yet"},
      {R"("num_bits": 8, "type": "int", "symmetric": true, "strategy": "channel")",
       R"("num_bits": 4, "type": "int", "symmetric": true, "strategy": "tensor")",
       "quantization_config.config_groups.group_0.weights"},
      {R"("symmetric": true, "strategy": "token")", R"("symmetric": false, "strategy": "token")",
       "quantization_config.config_groups.group_0.input_activations"},
  };
  for (const auto& r : kRefused) {
    std::string q = dynamic;
    q.replace(q.find(r.from), r.from.size(), r.to);
    auto bad = with(q);
    ASSERT_FALSE(bad.ok()) << r.to;
    EXPECT_EQ(bad.status().code(), StatusCode::kUnimplemented) << bad.status().message();
    EXPECT_NE(bad.status().message().find(r.message), std::string::npos) << bad.status().message();
  }
}

// AWQ, GPTQ and compressed-tensors pack-quantized configs as their producers write them
// (quantization-formats.md 2-4): the scheme is read; what Pagoda cannot run is refused by name.
TEST(ConfigFromHf, AwqGptqAndPackQuantized) {
  const std::string head = R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "quantization_config": )";
  auto with = [&](const std::string& q) { return config_from_hf_json(head + q + "}", "dir/config.json"); };
  auto awq = with(R"({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": true, "version": "gemm",
      "modules_to_not_convert": null})");
  ASSERT_TRUE(awq.ok()) << awq.status().message();
  EXPECT_EQ(awq->quantization.method, "awq");
  EXPECT_EQ(awq->quantization.bits, 4);
  EXPECT_EQ(awq->quantization.group_size, 128);
  EXPECT_FALSE(awq->quantization.symmetric);
  auto legacy = with(R"({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": true, "version": "GEMM"})");
  ASSERT_TRUE(legacy.ok()) << legacy.status().message();
  EXPECT_EQ(legacy->quantization.group_size, 64);

  auto gptq = with(R"({"quant_method": "gptq", "bits": 8, "group_size": -1, "desc_act": true, "sym": true,
      "damp_percent": 0.01, "true_sequential": true})");
  ASSERT_TRUE(gptq.ok()) << gptq.status().message();
  EXPECT_EQ(gptq->quantization.bits, 8);
  EXPECT_EQ(gptq->quantization.group_size, 0);
  EXPECT_TRUE(gptq->quantization.act_order);
  EXPECT_TRUE(gptq->quantization.zeros_minus_one);
  auto v2 = with(R"({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": false, "checkpoint_format": "gptq_v2"})");
  ASSERT_TRUE(v2.ok()) << v2.status().message();
  EXPECT_FALSE(v2->quantization.zeros_minus_one);
  EXPECT_FALSE(v2->quantization.symmetric);

  auto w4a16 = with(R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
      "config_groups": {"group_0": {"targets": ["Linear"], "input_activations": null,
        "weights": {"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group", "group_size": 128,
                    "actorder": "group", "dynamic": false}}}})");
  ASSERT_TRUE(w4a16.ok()) << w4a16.status().message();
  EXPECT_EQ(w4a16->quantization.format, "pack-quantized");
  EXPECT_EQ(w4a16->quantization.bits, 4);
  EXPECT_EQ(w4a16->quantization.group_size, 128);
  EXPECT_TRUE(w4a16->quantization.act_order);

  const struct {
    std::string config, message;
  } kRefused[] = {
      {R"({"quant_method": "awq", "bits": 3})", "quantization_config.bits 3 is not supported"},
      {R"({"quant_method": "awq", "bits": 4, "version": "gemv"})", "quantization_config.version \"gemv\" is not supported"},
      {R"({"quant_method": "awq", "bits": 4, "zero_point": false})", "zero_point false is not supported"},
      {R"({"quant_method": "awq", "bits": 4, "group_size": 100})", "group_size 100 is not -1 or a positive multiple of 8"},
      {R"({"quant_method": "gptq", "bits": 2})", "quantization_config.bits 2 is not supported"},
      {R"({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"})", "checkpoint_format \"marlin\" is not supported"},
      {R"({"quant_method": "gptq", "bits": "4"})", "quantization_config.bits \"4\" is not an integer"},
      {R"({"quant_method": "gptq", "bits": 4, "dynamic": {"-:.*": {}}})", "dynamic (per-module overrides)"},
      {R"({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"g": {"weights":
          {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}, "input_activations":
          {"num_bits": 8, "type": "int"}}}})", "config_groups.g weights"},
  };
  for (const auto& r : kRefused) {
    auto bad = with(r.config);
    ASSERT_FALSE(bad.ok()) << r.config;
    EXPECT_NE(bad.status().message().find(r.message), std::string::npos) << bad.status().message();
    EXPECT_EQ(bad.status().message().rfind("dir/config.json: quantization_config", 0), 0u) << bad.status().message();
  }
}

TEST(ConfigFromHf, MistralAndDefaults) {
  auto r = config_from_hf_json(R"({"architectures": ["MistralForCausalLM"], "vocab_size": 32000,
      "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "sliding_window": 4096,
      "max_position_embeddings": 32768, "rms_norm_eps": 1e-05, "rope_theta": 10000.0})",
                               "m.json");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->architecture, "llama");
  EXPECT_EQ(r->head_dim, 128);
  EXPECT_EQ(r->sliding_window, 4096);
  EXPECT_FALSE(r->tie_word_embeddings);
  EXPECT_EQ(r->rope_scaling.type, RopeScaling::Type::kNone);

  // Only model_type, null sliding window, no kv heads, no rope_theta.
  r = config_from_hf_json(R"({"model_type": "llama", "vocab_size": 100, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
      "sliding_window": null, "rope_scaling": null})",
                          "x");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_kv_heads, 4);
  EXPECT_EQ(r->head_dim, 16);
  EXPECT_EQ(r->sliding_window, 0);
  EXPECT_DOUBLE_EQ(r->rope_theta, 10000.0);
}

TEST(ConfigFromHf, Qwen2AndQwen3) {
  auto q2 = config_from_hf_json(R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
      "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
      "num_attention_heads": 14, "num_key_value_heads": 2, "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768,
      "use_sliding_window": false, "tie_word_embeddings": true, "max_window_layers": 21})",
                                "q2");
  ASSERT_TRUE(q2.ok()) << q2.status().message();
  EXPECT_EQ(q2->architecture, "qwen2");
  EXPECT_TRUE(q2->attention_bias);
  EXPECT_TRUE(q2->tie_word_embeddings);
  EXPECT_EQ(q2->sliding_window, 0);
  EXPECT_EQ(q2->head_dim, 64);
  EXPECT_FALSE(q2->qk_norm);

  auto q3 = config_from_hf_json(R"({"architectures": ["Qwen3ForCausalLM"], "attention_bias": false,
      "head_dim": 128, "hidden_size": 1024, "intermediate_size": 3072, "max_position_embeddings": 40960,
      "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
      "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
      "tie_word_embeddings": true, "use_sliding_window": false, "vocab_size": 151936})",
                                "q3");
  ASSERT_TRUE(q3.ok()) << q3.status().message();
  EXPECT_EQ(q3->architecture, "qwen3");
  EXPECT_TRUE(q3->qk_norm);
  EXPECT_FALSE(q3->attention_bias);
  EXPECT_EQ(q3->head_dim, 128);
  EXPECT_DOUBLE_EQ(q3->rope_theta, 1e6);
}

// The configs of Qwen3-30B-A3B, Qwen1.5-MoE-A2.7B and Mixtral-8x7B as published; their parameter
// counts are the model cards' (30.5B / 3.3B active, 14.3B / 2.7B, 46.7B / 12.9B).
TEST(ConfigFromHf, MixturesOfExperts) {
  auto q3 = config_from_hf_json(R"({"architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false,
      "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
      "intermediate_size": 6144, "max_position_embeddings": 40960, "mlp_only_layers": [],
      "model_type": "qwen3_moe", "moe_intermediate_size": 768, "norm_topk_prob": true,
      "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
      "num_key_value_heads": 4, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
      "sliding_window": null, "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 151936})",
                                "q3");
  ASSERT_TRUE(q3.ok()) << q3.status().message();
  EXPECT_EQ(q3->architecture, "qwen3_moe");
  EXPECT_TRUE(q3->qk_norm);
  EXPECT_EQ(q3->num_experts, 128);
  EXPECT_EQ(q3->num_experts_per_tok, 8);
  EXPECT_EQ(q3->moe_intermediate_size, 768);
  EXPECT_EQ(q3->shared_expert_intermediate_size, 0);
  EXPECT_TRUE(q3->norm_topk_prob);
  EXPECT_TRUE(q3->is_sparse_layer(0) && q3->is_sparse_layer(47));
  EXPECT_EQ(q3->max_intermediate_size(), 768);
  EXPECT_NEAR(static_cast<double>(q3->num_parameters()), 30.53e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(q3->num_active_parameters()), 3.35e9, 0.05e9);

  auto q2 = config_from_hf_json(R"({"architectures": ["Qwen2MoeForCausalLM"], "decoder_sparse_step": 1,
      "hidden_size": 2048, "intermediate_size": 5632, "max_position_embeddings": 8192, "model_type": "qwen2_moe",
      "moe_intermediate_size": 1408, "norm_topk_prob": false, "num_attention_heads": 16, "num_experts": 60,
      "num_experts_per_tok": 4, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
      "rope_theta": 1000000.0, "shared_expert_intermediate_size": 5632, "sliding_window": 32768,
      "tie_word_embeddings": false, "use_sliding_window": false, "vocab_size": 151936})",
                                "q2");
  ASSERT_TRUE(q2.ok()) << q2.status().message();
  EXPECT_EQ(q2->architecture, "qwen2_moe");
  EXPECT_TRUE(q2->attention_bias);
  EXPECT_FALSE(q2->norm_topk_prob);
  EXPECT_EQ(q2->shared_expert_intermediate_size, 5632);
  EXPECT_EQ(q2->max_intermediate_size(), 5632);
  EXPECT_NEAR(static_cast<double>(q2->num_parameters()), 14.3e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(q2->num_active_parameters()), 2.69e9, 0.05e9);

  auto mx = config_from_hf_json(R"({"architectures": ["MixtralForCausalLM"], "hidden_size": 4096,
      "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
      "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8,
      "num_local_experts": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "sliding_window": null,
      "tie_word_embeddings": false, "vocab_size": 32000})",
                                "mx");
  ASSERT_TRUE(mx.ok()) << mx.status().message();
  EXPECT_EQ(mx->architecture, "mixtral");
  EXPECT_EQ(mx->num_experts, 8);
  EXPECT_EQ(mx->moe_intermediate_size, 14336);
  EXPECT_TRUE(mx->norm_topk_prob);
  EXPECT_FALSE(mx->attention_bias || mx->qk_norm);
  EXPECT_NEAR(static_cast<double>(mx->num_parameters()), 46.7e9, 0.05e9);
  EXPECT_NEAR(static_cast<double>(mx->num_active_parameters()), 12.9e9, 0.05e9);

  // Qwen2-MoE's layer pattern: sparse every decoder_sparse_step-th layer, never in mlp_only_layers.
  auto pattern = config_from_hf_json(R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4, "vocab_size": 100,
      "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
      "shared_expert_intermediate_size": 16, "decoder_sparse_step": 2, "mlp_only_layers": [3]})",
                                     "pattern");
  ASSERT_TRUE(pattern.ok()) << pattern.status().message();
  std::string sparse;
  for (int64_t i = 0; i < 6; ++i) sparse += pattern->is_sparse_layer(i) ? 'S' : 'D';
  EXPECT_EQ(sparse, "DSDDDS");
  EXPECT_EQ(pattern->max_intermediate_size(), 128);

  // More experts per token than experts; a layer number past the last layer.
  for (const char* bad : {R"("num_experts": 4, "num_experts_per_tok": 5)", R"("num_experts": 4, "num_experts_per_tok": 2, "mlp_only_layers": [6])"}) {
    auto r = config_from_hf_json(std::string(R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 6, "num_attention_heads": 4, "vocab_size": 100, )") + bad + "}",
                                 "bad.json");
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find(std::string(bad).find("mlp_only") != std::string::npos ? "mlp_only_layers" : "num_experts_per_tok"),
              std::string::npos)
        << r.status().message();
    EXPECT_NE(r.status().message().find("bad.json"), std::string::npos) << r.status().message();
  }
}

TEST(ConfigFromHf, Errors) {
  auto expect_error = [](const std::string& json, StatusCode code, const std::string& needle) {
    auto r = config_from_hf_json(json, "dir/config.json");
    ASSERT_FALSE(r.ok()) << json;
    EXPECT_EQ(r.status().code(), code) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("dir/config.json: ", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  };
  const std::string base = R"("vocab_size": 100, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4)";
  expect_error("{", StatusCode::kDataLoss, "invalid JSON");
  expect_error("[]", StatusCode::kDataLoss, "not a JSON object");
  expect_error(R"({"architectures": ["GPT2LMHeadModel"], )" + base + "}", StatusCode::kUnimplemented,
               "unsupported architecture GPT2LMHeadModel");
  expect_error(R"({"model_type": "gemma", )" + base + "}", StatusCode::kUnimplemented, "gemma");
  expect_error("{" + base + "}", StatusCode::kDataLoss, "neither architectures nor model_type");
  expect_error(R"({"model_type": "llama", "vocab_size": 100})", StatusCode::kDataLoss,
               "missing field hidden_size");
  expect_error(R"({"model_type": "llama", "hidden_size": "64", "vocab_size": 100, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4})",
               StatusCode::kDataLoss, "hidden_size must be an integer");
  expect_error(R"({"model_type": "llama", "rope_scaling": {"rope_type": "longrope", "factor": 4}, )" + base + "}",
               StatusCode::kUnimplemented, "unsupported rope_scaling type longrope");
  expect_error(R"({"model_type": "llama", "rope_scaling": {"type": "su", "factor": 4}, )" + base + "}",
               StatusCode::kUnimplemented, "su");
  expect_error(R"({"model_type": "llama", "num_key_value_heads": 3, )" + base + "}",
               StatusCode::kInvalidArgument, "num_kv_heads");
  expect_error(R"({"model_type": "llama", "hidden_act": "gelu", )" + base + "}",
               StatusCode::kUnimplemented, "gelu");
  expect_error(R"({"model_type": "llama", "vocab_size": 1e300, "hidden_size": 64, "intermediate_size": 128,
      "num_hidden_layers": 2, "num_attention_heads": 4})",
               StatusCode::kDataLoss, "vocab_size");
  // Linear scaling is accepted, legacy "type" key too.
  auto r = config_from_hf_json(R"({"model_type": "llama", "rope_scaling": {"type": "linear", "factor": 2.0}, )" +
                                   base + "}",
                               "x");
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(r->rope_scaling.factor, 2.0);
}

// ---- GGUF metadata -------------------------------------------------------------------------

TEST(ConfigFromGguf, Stories260K) {
  PAGODA_TEST_FILE(path, "stories260K/stories260K.gguf");
  auto g = GgufFile::open(path);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto r = config_from_gguf(**g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.max_position_embeddings, 2048);
  EXPECT_NEAR(c.rms_norm_eps, 1e-5, 1e-10);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_TRUE(c.rope_interleaved);
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(ConfigFromGguf, VocabFileHasHyperparameters) {
  PAGODA_TEST_FILE(path, "vocab/ggml-vocab-llama-spm.gguf");
  auto g = GgufFile::open(path);
  ASSERT_TRUE(g.ok());
  auto r = config_from_gguf(**g);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->num_layers, 32);
  EXPECT_EQ(r->hidden_size, 4096);
  EXPECT_EQ(r->vocab_size, 32000);
  EXPECT_TRUE(r->tie_word_embeddings);  // no tensors at all
}

class ConfigFromGgufCrafted : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::make_temp_dir(); }
  GgufWriter base(const std::string& arch) {
    GgufWriter w;
    w.add_string("general.architecture", arch);
    w.add_u32(arch + ".embedding_length", 64);
    w.add_u32(arch + ".feed_forward_length", 128);
    w.add_u32(arch + ".block_count", 2);
    w.add_u32(arch + ".attention.head_count", 4);
    w.add_u32(arch + ".vocab_size", 100);
    return w;
  }
  Result<ModelConfig> parse(const GgufWriter& w) {
    std::string path = dir_ + "/c" + std::to_string(n_++) + ".gguf";
    EXPECT_TRUE(w.write(path).ok());
    auto g = GgufFile::open(path);
    if (!g.ok()) return g.status();
    return config_from_gguf(**g);
  }
  std::string dir_;
  int n_ = 0;
};

TEST_F(ConfigFromGgufCrafted, ArchitecturesAndDefaults) {
  auto r = parse(base("qwen2"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->architecture, "qwen2");
  EXPECT_TRUE(r->attention_bias);
  EXPECT_FALSE(r->rope_interleaved);
  EXPECT_EQ(r->num_kv_heads, 4);
  EXPECT_EQ(r->head_dim, 16);
  EXPECT_EQ(r->vocab_size, 100);
  EXPECT_TRUE(r->tie_word_embeddings);

  GgufWriter q3 = base("qwen3");
  q3.add_u32("qwen3.attention.key_length", 32);
  q3.add_u32("qwen3.attention.value_length", 32);
  q3.add_u32("qwen3.attention.head_count_kv", 2);
  q3.add_f32("qwen3.rope.freq_base", 1e6f);
  q3.add_f32("qwen3.attention.layer_norm_rms_epsilon", 1e-6f);
  r = parse(q3);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(r->qk_norm);
  EXPECT_FALSE(r->attention_bias);
  EXPECT_EQ(r->head_dim, 32);
  EXPECT_EQ(r->num_kv_heads, 2);
  EXPECT_DOUBLE_EQ(r->rope_theta, 1e6);

  GgufWriter lin = base("llama");
  lin.add_string("llama.rope.scaling.type", "linear");
  lin.add_f32("llama.rope.scaling.factor", 4.0f);
  r = parse(lin);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(r->rope_scaling.factor, 4.0);
  EXPECT_TRUE(r->rope_interleaved);

  // Vocabulary size from the tokenizer when <arch>.vocab_size is absent.
  GgufWriter tok;
  tok.add_string("general.architecture", "llama");
  tok.add_u32("llama.embedding_length", 64);
  tok.add_u32("llama.feed_forward_length", 128);
  tok.add_u32("llama.block_count", 2);
  tok.add_u32("llama.attention.head_count", 4);
  tok.add_string_array("tokenizer.ggml.tokens", {"a", "b", "c"});
  r = parse(tok);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->vocab_size, 3);
}

TEST_F(ConfigFromGgufCrafted, Errors) {
  GgufWriter w = base("gpt2");
  auto r = parse(w);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("unsupported architecture gpt2"), std::string::npos);

  w = base("llama");
  w.add_string("llama.rope.scaling.type", "longrope");
  r = parse(w);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("longrope"), std::string::npos);

  w = base("llama");
  w.add_string("llama.rope.scaling.type", "yarn");  // without its factor
  r = parse(w);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("llama.rope.scaling.factor"), std::string::npos) << r.status().message();

  w = base("llama");
  w.add_u32("llama.rope.dimension_count", 8);
  r = parse(w);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("partial rotary"), std::string::npos);

  w = base("llama");
  w.add_u32("llama.attention.head_count_kv", 3);
  EXPECT_EQ(parse(w).status().code(), StatusCode::kInvalidArgument);

  GgufWriter missing;
  missing.add_string("general.architecture", "llama");
  r = parse(missing);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("llama.embedding_length"), std::string::npos);

  w = GgufWriter();
  w.add_string("general.architecture", "llama");
  w.add_string("llama.embedding_length", "64");
  r = parse(w);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
}

// llama.cpp's YaRN keys, as its converter writes them for Qwen2.5's rope_scaling (type, factor,
// original_context_length) and the betas where a checkpoint names them; what would change the
// ramp or the magnitude is refused by name.
TEST_F(ConfigFromGgufCrafted, YarnKeys) {
  GgufWriter w = base("qwen2");
  w.add_u32("qwen2.context_length", 32768);
  w.add_string("qwen2.rope.scaling.type", "yarn");
  w.add_f32("qwen2.rope.scaling.factor", 4.0f);
  w.add_u32("qwen2.rope.scaling.original_context_length", 32768);
  auto r = parse(w);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_DOUBLE_EQ(r->rope_scaling.factor, 4.0);
  EXPECT_EQ(r->rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_DOUBLE_EQ(r->rope_scaling.beta_fast, 32.0);
  EXPECT_DOUBLE_EQ(r->rope_scaling.beta_slow, 1.0);
  EXPECT_EQ(r->max_context_len(), 4 * 32768);

  // Betas from the file; without original_context_length, the file's context.
  w = base("llama");
  w.add_u32("llama.context_length", 4096);
  w.add_string("llama.rope.scaling.type", "yarn");
  w.add_f32("llama.rope.scaling.factor", 2.0f);
  w.add_f32("llama.rope.scaling.yarn_beta_fast", 16.0f);
  w.add_f32("llama.rope.scaling.yarn_beta_slow", 2.0f);
  w.add_f32("llama.rope.scaling.yarn_ext_factor", 1.0f);
  r = parse(w);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.original_max_position_embeddings, 4096);
  EXPECT_DOUBLE_EQ(r->rope_scaling.beta_fast, 16.0);
  EXPECT_DOUBLE_EQ(r->rope_scaling.beta_slow, 2.0);

  for (const char* k : {"rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_ext_factor", "rope.scaling.attn_factor"}) {
    w = base("qwen2");
    w.add_string("qwen2.rope.scaling.type", "yarn");
    w.add_f32("qwen2.rope.scaling.factor", 4.0f);
    w.add_f32(std::string("qwen2.") + k, 0.5f);
    r = parse(w);
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented) << k;
    EXPECT_NE(r.status().message().find(k), std::string::npos) << r.status().message();
  }
  w = base("qwen2");
  w.add_string("qwen2.rope.scaling.type", "longrope");
  r = parse(w);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("longrope"), std::string::npos);
}

// vLLM's --hf-overrides: config.json fields over any checkpoint's config.
TEST(ApplyHfOverrides, RopeFieldsReplaceTheCheckpointsAndOthersAreRefused) {
  ModelConfig c = *dummy_preset("qwen2.5-0.5b");
  const ModelConfig before = c;
  ASSERT_TRUE(apply_hf_overrides(R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}, "rope_theta": 20000})",
                                 "--hf-overrides", &c)
                  .ok());
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 4.0);
  // yarn's original length defaults to the model's context, as in config.json.
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, before.max_position_embeddings);
  EXPECT_DOUBLE_EQ(c.rope_theta, 20000.0);
  EXPECT_EQ(c.max_context_len(), 4 * before.max_position_embeddings);

  ASSERT_TRUE(apply_hf_overrides(R"({"max_position_embeddings": 1024, "rope_scaling": {"type": "linear", "factor": 2}})",
                                 "--hf-overrides", &c)
                  .ok());
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c.max_context_len(), 2048);
  ASSERT_TRUE(apply_hf_overrides(R"({"rope_scaling": null})", "--hf-overrides", &c).ok());
  EXPECT_EQ(c.rope_scaling.type, RopeScaling::Type::kNone);

  // Refused, naming what: another field, bad JSON, a bad value, an unknown scaling; c unchanged.
  const ModelConfig kept = c;
  Status st = apply_hf_overrides(R"({"num_hidden_layers": 3})", "--hf-overrides", &c);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("num_hidden_layers"), std::string::npos) << st.message();
  st = apply_hf_overrides(R"({"rope_theta": )", "--hf-overrides", &c);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("--hf-overrides"), std::string::npos) << st.message();
  st = apply_hf_overrides(R"({"rope_theta": -1})", "--hf-overrides", &c);
  EXPECT_FALSE(st.ok());
  st = apply_hf_overrides(R"({"rope_scaling": {"rope_type": "longrope", "factor": 2}})", "--rope-scaling", &c);
  EXPECT_EQ(st.code(), StatusCode::kUnimplemented);
  EXPECT_NE(st.message().find("longrope"), std::string::npos) << st.message();
  EXPECT_EQ(c.rope_theta, kept.rope_theta);
  EXPECT_EQ(c.max_position_embeddings, kept.max_position_embeddings);
  EXPECT_EQ(c.rope_scaling.type, kept.rope_scaling.type);
}

// llama.cpp's rope_freqs.weight for Llama 3 scaling, computed the way its converter does.
std::vector<float> llama3_freq_factors(double theta, int64_t head_dim, double factor) {
  std::vector<float> out;
  for (int64_t i = 0; i < head_dim; i += 2) {
    double freq = 1.0 / std::pow(theta, static_cast<double>(i) / static_cast<double>(head_dim));
    double wavelen = 2 * std::numbers::pi / freq;
    if (wavelen < 8192.0 / 4.0) {
      out.push_back(1.0f);
    } else if (wavelen > 8192.0 / 1.0) {
      out.push_back(static_cast<float>(factor));
    } else {
      double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      out.push_back(static_cast<float>(1.0 / ((1 - smooth) / factor + smooth)));
    }
  }
  return out;
}

TEST_F(ConfigFromGgufCrafted, Llama3RopeFreqs) {
  GgufWriter w = base("llama");
  w.add_f32("llama.rope.freq_base", 500000.0f);
  std::vector<float> factors = llama3_freq_factors(500000.0, 16, 32.0);
  w.add_tensor("rope_freqs.weight", DType::kF32, {8}, testing::f32_bytes(factors));
  auto r = parse(w);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(r->rope_scaling.factor, 32.0);
  EXPECT_EQ(r->rope_scaling.original_max_position_embeddings, 8192);

  w = base("llama");
  w.add_f32("llama.rope.freq_base", 500000.0f);
  factors[3] *= 1.5f;
  w.add_tensor("rope_freqs.weight", DType::kF32, {8}, testing::f32_bytes(factors));
  r = parse(w);
  EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  EXPECT_NE(r.status().message().find("rope_freqs.weight"), std::string::npos);

  // Non-finite divisors must not slip through (NaN compares false against any tolerance): an
  // all-NaN tensor, and one whose factor is infinite, are refused rather than yielding a
  // RopeScaling with a NaN / inf factor that validate() would have rejected.
  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    w = base("llama");
    w.add_f32("llama.rope.freq_base", 500000.0f);
    factors = std::isnan(bad) ? std::vector<float>(8, bad) : llama3_freq_factors(500000.0, 16, bad);
    w.add_tensor("rope_freqs.weight", DType::kF32, {8}, testing::f32_bytes(factors));
    r = parse(w);
    ASSERT_FALSE(r.ok()) << "factor " << bad << " accepted: " << r->rope_scaling.factor;
    EXPECT_NE(r.status().message().find("rope_freqs.weight"), std::string::npos) << r.status().message();
  }
  // A largest divisor of 1 is "no scaling" only when every divisor is 1: divisors below 1, or
  // NaN after a leading 1 (std::max_element then returns the 1), are refused, not ignored.
  for (float bad : {0.5f, std::numeric_limits<float>::quiet_NaN()}) {
    w = base("llama");
    factors.assign(8, 1.0f);
    factors[5] = bad;
    w.add_tensor("rope_freqs.weight", DType::kF32, {8}, testing::f32_bytes(factors));
    r = parse(w);
    ASSERT_FALSE(r.ok()) << "divisor " << bad << " ignored";
    EXPECT_EQ(r.status().code(), StatusCode::kUnimplemented);
  }
  w = base("llama");
  w.add_tensor("rope_freqs.weight", DType::kF32, {8}, testing::f32_bytes(std::vector<float>(8, 1.0f)));
  r = parse(w);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->rope_scaling.type, RopeScaling::Type::kNone);
}

}  // namespace
}  // namespace pagoda
