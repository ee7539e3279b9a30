// The same random model written as a GGUF file and as a Hugging Face directory (this test writes
// both, converting as llama.cpp's converter does: GGUF llama files carry Q/K rows permuted for
// adjacent-pair RoPE) must load to the same config and give the same logits.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "loader/gguf_writer.h"
#include "loader/safetensors_writer.h"
#include "model/model.h"
#include "support/test_data.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

struct Spec {
  std::string arch;  // llama, qwen2, qwen3
  int64_t vocab = 96, hidden = 64, inter = 96, layers = 2, heads = 4, kv_heads = 2, head_dim = 16;
  bool tied = false;
  DType dtype = DType::kF32;
  bool sharded = false;
};

struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Random weights under HF names.
std::map<std::string, HostTensor> random_hf_weights(const Spec& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::map<std::string, HostTensor> w;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, float scale, float offset) {
    int64_t n = 1;
    for (auto d : shape) n *= d;
    HostTensor t{shape, std::vector<float>(n)};
    for (auto& v : t.values) v = offset + scale * dist(rng);
    w[name] = std::move(t);
  };
  const float ws = 1.0f / std::sqrt(static_cast<float>(s.hidden));
  add("model.embed_tokens.weight", {s.vocab, s.hidden}, 1, 0);
  if (!s.tied) add("lm_head.weight", {s.vocab, s.hidden}, ws, 0);
  add("model.norm.weight", {s.hidden}, 0.2f, 1);
  for (int64_t i = 0; i < s.layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {s.hidden}, 0.2f, 1);
    add(p + "post_attention_layernorm.weight", {s.hidden}, 0.2f, 1);
    add(p + "self_attn.q_proj.weight", {s.heads * s.head_dim, s.hidden}, ws, 0);
    add(p + "self_attn.k_proj.weight", {s.kv_heads * s.head_dim, s.hidden}, ws, 0);
    add(p + "self_attn.v_proj.weight", {s.kv_heads * s.head_dim, s.hidden}, ws, 0);
    add(p + "self_attn.o_proj.weight", {s.hidden, s.heads * s.head_dim}, ws, 0);
    if (s.arch == "qwen2") {
      add(p + "self_attn.q_proj.bias", {s.heads * s.head_dim}, 0.3f, 0);
      add(p + "self_attn.k_proj.bias", {s.kv_heads * s.head_dim}, 0.3f, 0);
      add(p + "self_attn.v_proj.bias", {s.kv_heads * s.head_dim}, 0.3f, 0);
    }
    if (s.arch == "qwen3") {
      add(p + "self_attn.q_norm.weight", {s.head_dim}, 0.2f, 1);
      add(p + "self_attn.k_norm.weight", {s.head_dim}, 0.2f, 1);
    }
    add(p + "mlp.gate_proj.weight", {s.inter, s.hidden}, ws, 0);
    add(p + "mlp.up_proj.weight", {s.inter, s.hidden}, ws, 0);
    add(p + "mlp.down_proj.weight", {s.hidden, s.inter}, 1.0f / std::sqrt(static_cast<float>(s.inter)), 0);
  }
  return w;
}

std::vector<uint8_t> encode(const std::vector<float>& v, DType t) {
  std::vector<uint8_t> bytes(*dtype_bytes(t, v.size()));
  quantize_row(t, v.data(), bytes.data(), static_cast<int64_t>(v.size()));
  return bytes;
}

// HF [n_head * head_dim, in] rows in rotate-half order -> GGUF llama's adjacent-pair order.
std::vector<float> permute_for_gguf_llama(const HostTensor& t, int64_t n_head) {
  const int64_t rows = t.shape[0], cols = t.shape.size() > 1 ? t.shape[1] : 1;
  const int64_t hd = rows / n_head, half = hd / 2;
  std::vector<float> out(t.values.size());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t s = 0; s < 2; ++s) {
        int64_t dst = h * hd + 2 * j + s, src = h * hd + s * half + j;
        std::copy_n(&t.values[src * cols], cols, &out[dst * cols]);
      }
  return out;
}

std::string gguf_name(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> map = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.", "attn_q."}, {"self_attn.k_proj.", "attn_k."},
      {"self_attn.v_proj.", "attn_v."}, {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"}, {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "lm_head.weight") return "output.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  std::string rest = hf.substr(std::string("model.layers.").size());
  std::string layer = rest.substr(0, rest.find('.'));
  rest = rest.substr(layer.size() + 1);
  for (const auto& [from, to] : map) {
    if (rest.rfind(from, 0) == 0) return "blk." + layer + "." + to + rest.substr(from.size());
  }
  ADD_FAILURE() << "unmapped " << hf;
  return hf;
}

void write_gguf(const Spec& s, const std::map<std::string, HostTensor>& w, const std::string& path) {
  GgufWriter g;
  const std::string a = s.arch;
  g.add_string("general.architecture", a);
  g.add_u32(a + ".embedding_length", static_cast<uint32_t>(s.hidden));
  g.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.inter));
  g.add_u32(a + ".block_count", static_cast<uint32_t>(s.layers));
  g.add_u32(a + ".attention.head_count", static_cast<uint32_t>(s.heads));
  g.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  g.add_u32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
  g.add_u32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
  g.add_u32(a + ".context_length", 256);
  g.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  g.add_f32(a + ".rope.freq_base", 100000.0f);
  for (const auto& [name, t] : w) {
    std::vector<float> values = t.values;
    bool is_q = name.find("q_proj") != std::string::npos, is_k = name.find("k_proj") != std::string::npos;
    if (a == "llama" && (is_q || is_k)) values = permute_for_gguf_llama(t, is_q ? s.heads : s.kv_heads);
    bool small = t.shape.size() == 1;  // norms and biases stay f32, as converters keep them
    DType dt = small ? DType::kF32 : s.dtype;
    g.add_tensor(gguf_name(name), dt, t.shape, encode(values, dt));
  }
  ASSERT_TRUE(g.write(path).ok());
}

void write_hf_dir(const Spec& s, const std::map<std::string, HostTensor>& w, const std::string& dir) {
  std::string arch_class = s.arch == "llama" ? "LlamaForCausalLM" : s.arch == "qwen2" ? "Qwen2ForCausalLM" : "Qwen3ForCausalLM";
  std::ofstream(dir + "/config.json")
      << "{\"architectures\": [\"" << arch_class << "\"], \"model_type\": \"" << s.arch << "\", "
      << "\"vocab_size\": " << s.vocab << ", \"hidden_size\": " << s.hidden
      << ", \"intermediate_size\": " << s.inter << ", \"num_hidden_layers\": " << s.layers
      << ", \"num_attention_heads\": " << s.heads << ", \"num_key_value_heads\": " << s.kv_heads
      << ", \"head_dim\": " << s.head_dim << ", \"max_position_embeddings\": 256"
      << ", \"rms_norm_eps\": 1e-6, \"rope_theta\": 100000.0, \"rope_scaling\": null"
      << ", \"tie_word_embeddings\": " << (s.tied ? "true" : "false")
      << ", \"torch_dtype\": \"float32\"}";
  // Sharded: alternate tensors between two files, listed in the index.
  SafetensorsWriter shards[2];
  std::string index = "{\"metadata\": {}, \"weight_map\": {";
  int i = 0;
  for (const auto& [name, t] : w) {
    int shard = s.sharded ? i % 2 : 0;
    DType dt = t.shape.size() == 1 ? DType::kF32 : s.dtype;
    shards[shard].add_tensor(name, dt, t.shape, encode(t.values, dt));
    index += std::string(i ? ", " : "") + "\"" + name + "\": \"model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors\"";
    ++i;
  }
  index += "}}";
  if (s.sharded) {
    ASSERT_TRUE(shards[0].write(dir + "/model-00001-of-00002.safetensors").ok());
    ASSERT_TRUE(shards[1].write(dir + "/model-00002-of-00002.safetensors").ok());
    std::ofstream(dir + "/model.safetensors.index.json") << index;
  } else {
    ASSERT_TRUE(shards[0].write(dir + "/model.safetensors").ok());
  }
}

std::vector<float> all_logits(const std::string& path, const std::vector<TokenId>& tokens) {
  auto source = load_model(path, LoadOptions{});
  EXPECT_TRUE(source.ok()) << source.status().message();
  if (!source.ok()) return {};
  auto backend = cpu::CpuBackend::create();
  EXPECT_TRUE(backend.ok());
  if (!backend.ok()) return {};
  auto model = create_model(std::move(*source), **backend);
  EXPECT_TRUE(model.ok()) << model.status().message();
  if (!model.ok()) return {};
  const int64_t n = static_cast<int64_t>(tokens.size());
  auto kv = KvCacheTensors::allocate((*model)->config(), 4, 16);
  std::vector<BlockId> table = {2, 0, 3, 1};
  std::vector<int32_t> pos(n);
  std::vector<int64_t> slots(n), rows(n);
  for (int64_t i = 0; i < n; ++i) {
    pos[i] = static_cast<int32_t>(i);
    slots[i] = table[i / 16] * 16 + i % 16;
    rows[i] = i;
  }
  AttentionSeq seq{0, n, n, table.data()};
  ForwardBatch batch{tokens, pos, slots, {&seq, 1}};
  Tensor hidden = (*model)->forward(batch, *kv);
  std::vector<float> logits(n * (*model)->config().vocab_size);
  (*model)->compute_logits(hidden, rows.data(), n, logits.data());
  return logits;
}

void expect_same_logits(const Spec& s, uint32_t seed) {
  auto weights = random_hf_weights(s, seed);
  std::string dir = testing::make_temp_dir();
  ASSERT_FALSE(dir.empty());
  std::string gguf = dir + "/model.gguf";
  write_gguf(s, weights, gguf);
  write_hf_dir(s, weights, dir);

  auto from_gguf = load_model(gguf, LoadOptions{});
  auto from_hf = load_model(dir, LoadOptions{});
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status().message();
  ASSERT_TRUE(from_hf.ok()) << from_hf.status().message();
  const ModelConfig &a = from_gguf->config, &b = from_hf->config;
  EXPECT_EQ(a.architecture, b.architecture);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.num_kv_heads, b.num_kv_heads);
  EXPECT_EQ(a.tie_word_embeddings, b.tie_word_embeddings);
  EXPECT_EQ(a.attention_bias, b.attention_bias);
  EXPECT_EQ(a.qk_norm, b.qk_norm);
  EXPECT_NEAR(a.rms_norm_eps, b.rms_norm_eps, 1e-12);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_interleaved, s.arch == "llama");
  EXPECT_FALSE(b.rope_interleaved);

  std::vector<TokenId> tokens = {1, 45, 7, 95, 23, 23, 60, 2, 88, 14, 31, 77, 5, 0, 42, 66, 19, 50};
  auto la = all_logits(gguf, tokens), lb = all_logits(dir, tokens);
  ASSERT_EQ(la.size(), lb.size());
  ASSERT_FALSE(la.empty());
  double scale = 0;
  for (float v : lb) scale = std::max(scale, static_cast<double>(std::fabs(v)));
  for (size_t i = 0; i < la.size(); ++i) ASSERT_NEAR(la[i], lb[i], 1e-5 * scale) << i;
}

TEST(GgufHfEquivalence, LlamaF32PermutedRope) { expect_same_logits({.arch = "llama"}, 1); }
TEST(GgufHfEquivalence, LlamaF16Sharded) {
  expect_same_logits({.arch = "llama", .dtype = DType::kF16, .sharded = true}, 2);
}
TEST(GgufHfEquivalence, Qwen2BiasTiedBf16) {
  expect_same_logits({.arch = "qwen2", .kv_heads = 1, .tied = true, .dtype = DType::kBF16}, 3);
}
TEST(GgufHfEquivalence, Qwen3QkNorm) {
  expect_same_logits({.arch = "qwen3", .head_dim = 32, .tied = true, .sharded = true}, 4);
}

}  // namespace
}  // namespace pagoda
