// The same random model written as a GGUF file and as a Hugging Face directory (this test writes
// both, converting as llama.cpp's converter does: GGUF llama files carry Q/K rows permuted for
// adjacent-pair RoPE; a mixture of experts' per-expert HF tensors become GGUF's stacked
// ffn_*_exps tensors) must load to the same config and give the same logits.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "loader/gguf_writer.h"
#include "loader/safetensors_writer.h"
#include "model/model.h"
#include "support/test_data.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

struct Spec {
  std::string arch;  // llama, qwen2, qwen3, qwen3_moe, qwen2_moe, mixtral
  int64_t vocab = 96, hidden = 64, inter = 96, layers = 2, heads = 4, kv_heads = 2, head_dim = 16;
  int64_t experts = 0, top_k = 0, moe_inter = 32, shared_inter = 0;  // every layer sparse where experts > 0
  bool tied = false;
  DType dtype = DType::kF32;
  bool sharded = false;
  bool per_expert_gguf = false;  // GGUF experts under older files' per-expert names, not stacked
  int64_t gguf_expert_count = 0;  // what the GGUF file claims, where not `experts` (bad files)
  int64_t gguf_top_k = 0;
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
    if (s.arch == "qwen2" || s.arch == "qwen2_moe") {
      add(p + "self_attn.q_proj.bias", {s.heads * s.head_dim}, 0.3f, 0);
      add(p + "self_attn.k_proj.bias", {s.kv_heads * s.head_dim}, 0.3f, 0);
      add(p + "self_attn.v_proj.bias", {s.kv_heads * s.head_dim}, 0.3f, 0);
    }
    if (s.arch == "qwen3" || s.arch == "qwen3_moe") {
      add(p + "self_attn.q_norm.weight", {s.head_dim}, 0.2f, 1);
      add(p + "self_attn.k_norm.weight", {s.head_dim}, 0.2f, 1);
    }
    if (s.experts == 0) {
      add(p + "mlp.gate_proj.weight", {s.inter, s.hidden}, ws, 0);
      add(p + "mlp.up_proj.weight", {s.inter, s.hidden}, ws, 0);
      add(p + "mlp.down_proj.weight", {s.hidden, s.inter}, 1.0f / std::sqrt(static_cast<float>(s.inter)), 0);
      continue;
    }
    const bool mixtral = s.arch == "mixtral";
    const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
    add(moe + "gate.weight", {s.experts, s.hidden}, 4 * ws, 0);
    const float wd = 1.0f / std::sqrt(static_cast<float>(s.moe_inter));
    for (int64_t e = 0; e < s.experts; ++e) {
      const std::string x = moe + "experts." + std::to_string(e) + ".";
      add(x + (mixtral ? "w1.weight" : "gate_proj.weight"), {s.moe_inter, s.hidden}, ws, 0);
      add(x + (mixtral ? "w3.weight" : "up_proj.weight"), {s.moe_inter, s.hidden}, ws, 0);
      add(x + (mixtral ? "w2.weight" : "down_proj.weight"), {s.hidden, s.moe_inter}, wd, 0);
    }
    if (s.shared_inter > 0) {
      add(moe + "shared_expert.gate_proj.weight", {s.shared_inter, s.hidden}, ws, 0);
      add(moe + "shared_expert.up_proj.weight", {s.shared_inter, s.hidden}, ws, 0);
      add(moe + "shared_expert.down_proj.weight", {s.hidden, s.shared_inter},
          1.0f / std::sqrt(static_cast<float>(s.shared_inter)), 0);
      add(moe + "shared_expert_gate.weight", {1, s.hidden}, ws, 0);
    }
  }
  return w;
}

// The GGUF file's architecture: llama.cpp's names; Mixtral is llama with experts.
std::string gguf_arch(const Spec& s) {
  return s.arch == "mixtral" ? "llama" : s.arch == "qwen3_moe" ? "qwen3moe" : s.arch == "qwen2_moe" ? "qwen2moe" : s.arch;
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

// Expert e's HF projection -> (GGUF's stacked tensor name, e); false for other tensors.
bool stacked_expert(const std::string& hf, std::string* stacked, int64_t* expert) {
  static const std::vector<std::pair<std::string, std::string>> proj = {
      {"gate_proj.weight", "ffn_gate_exps.weight"}, {"up_proj.weight", "ffn_up_exps.weight"},
      {"down_proj.weight", "ffn_down_exps.weight"}, {"w1.weight", "ffn_gate_exps.weight"},
      {"w3.weight", "ffn_up_exps.weight"},           {"w2.weight", "ffn_down_exps.weight"}};
  const size_t at = hf.find(".experts.");
  if (at == std::string::npos) return false;
  std::string rest = hf.substr(std::string("model.layers.").size());
  const std::string layer = rest.substr(0, rest.find('.'));
  const std::string tail = hf.substr(at + 9);  // "<e>.<proj>"
  *expert = std::stoll(tail.substr(0, tail.find('.')));
  for (const auto& [from, to] : proj) {
    if (tail.substr(tail.find('.') + 1) == from) {
      *stacked = "blk." + layer + "." + to;
      return true;
    }
  }
  ADD_FAILURE() << "unmapped expert tensor " << hf;
  return false;
}

std::string gguf_name(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> map = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.", "attn_q."}, {"self_attn.k_proj.", "attn_k."},
      {"self_attn.v_proj.", "attn_v."}, {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"}, {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"}, {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate.weight", "ffn_gate_inp.weight"}, {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
      {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
      {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
      {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
      {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"}};
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (const size_t at = hf.find(".experts."); at != std::string::npos) {  // older files' per-expert names
    std::string stacked;
    int64_t e = 0;
    if (!stacked_expert(hf, &stacked, &e)) return hf;
    return stacked.substr(0, stacked.size() - std::string("_exps.weight").size()) + "." + std::to_string(e) + ".weight";
  }
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
  const std::string a = gguf_arch(s);
  g.add_string("general.architecture", a);
  g.add_u32(a + ".embedding_length", static_cast<uint32_t>(s.hidden));
  g.add_u32(a + ".feed_forward_length", static_cast<uint32_t>(s.arch == "mixtral" ? s.moe_inter : s.inter));
  if (s.experts > 0) {
    g.add_u32(a + ".expert_count", static_cast<uint32_t>(s.gguf_expert_count > 0 ? s.gguf_expert_count : s.experts));
    g.add_u32(a + ".expert_used_count", static_cast<uint32_t>(s.gguf_top_k > 0 ? s.gguf_top_k : s.top_k));
    if (a != "llama") g.add_u32(a + ".expert_feed_forward_length", static_cast<uint32_t>(s.moe_inter));
    if (s.shared_inter > 0) g.add_u32(a + ".expert_shared_feed_forward_length", static_cast<uint32_t>(s.shared_inter));
  }
  g.add_u32(a + ".block_count", static_cast<uint32_t>(s.layers));
  g.add_u32(a + ".attention.head_count", static_cast<uint32_t>(s.heads));
  g.add_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(s.kv_heads));
  g.add_u32(a + ".attention.key_length", static_cast<uint32_t>(s.head_dim));
  g.add_u32(a + ".attention.value_length", static_cast<uint32_t>(s.head_dim));
  g.add_u32(a + ".context_length", 256);
  g.add_f32(a + ".attention.layer_norm_rms_epsilon", 1e-6f);
  g.add_f32(a + ".rope.freq_base", 100000.0f);
  std::map<std::string, HostTensor> stacked;  // [experts, rows, cols], filled expert by expert
  for (const auto& [name, t] : w) {
    std::string stacked_name;
    int64_t e = 0;
    if (!s.per_expert_gguf && stacked_expert(name, &stacked_name, &e)) {
      HostTensor& st = stacked[stacked_name];
      if (st.values.empty()) {
        st.shape = {s.experts, t.shape[0], t.shape[1]};
        st.values.resize(static_cast<size_t>(s.experts) * t.values.size());
      }
      std::copy(t.values.begin(), t.values.end(), st.values.begin() + e * static_cast<int64_t>(t.values.size()));
      continue;
    }
    std::vector<float> values = t.values;
    bool is_q = name.find("q_proj") != std::string::npos, is_k = name.find("k_proj") != std::string::npos;
    if (a == "llama" && (is_q || is_k)) values = permute_for_gguf_llama(t, is_q ? s.heads : s.kv_heads);
    bool small = t.shape.size() == 1;  // norms and biases stay f32, as converters keep them
    DType dt = small ? DType::kF32 : s.dtype;
    std::vector<int64_t> shape = t.shape;
    if (name.ends_with("shared_expert_gate.weight")) shape = {s.hidden};  // llama.cpp's [hidden]
    g.add_tensor(gguf_name(name), dt, shape, encode(values, dt));
  }
  for (const auto& [name, t] : stacked) g.add_tensor(name, s.dtype, t.shape, encode(t.values, s.dtype));
  ASSERT_TRUE(g.write(path).ok());
}

void write_hf_dir(const Spec& s, const std::map<std::string, HostTensor>& w, const std::string& dir) {
  const std::map<std::string, std::string> classes = {
      {"llama", "LlamaForCausalLM"},         {"qwen2", "Qwen2ForCausalLM"},
      {"qwen3", "Qwen3ForCausalLM"},         {"qwen3_moe", "Qwen3MoeForCausalLM"},
      {"qwen2_moe", "Qwen2MoeForCausalLM"}, {"mixtral", "MixtralForCausalLM"}};
  std::string moe;
  if (s.arch == "mixtral") {
    moe = ", \"num_local_experts\": " + std::to_string(s.experts) + ", \"num_experts_per_tok\": " + std::to_string(s.top_k);
  } else if (s.experts > 0) {
    moe = ", \"num_experts\": " + std::to_string(s.experts) + ", \"num_experts_per_tok\": " + std::to_string(s.top_k) +
          ", \"moe_intermediate_size\": " + std::to_string(s.moe_inter) + ", \"norm_topk_prob\": " +
          (s.arch == "qwen3_moe" ? "true" : "false") + ", \"decoder_sparse_step\": 1, \"mlp_only_layers\": []";
    if (s.shared_inter > 0) moe += ", \"shared_expert_intermediate_size\": " + std::to_string(s.shared_inter);
  }
  std::ofstream(dir + "/config.json")
      << "{\"architectures\": [\"" << classes.at(s.arch) << "\"], \"model_type\": \"" << s.arch << "\", "
      << "\"vocab_size\": " << s.vocab << ", \"hidden_size\": " << s.hidden
      << ", \"intermediate_size\": " << (s.arch == "mixtral" ? s.moe_inter : s.inter) << moe
      << ", \"num_hidden_layers\": " << s.layers
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
  auto kv = KvCacheTensors::allocate((*model)->kernels(), (*model)->config(), 4, 16);
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
  EXPECT_EQ(a.num_experts, b.num_experts);
  EXPECT_EQ(a.num_experts_per_tok, b.num_experts_per_tok);
  EXPECT_EQ(a.moe_intermediate_size, b.moe_intermediate_size);
  EXPECT_EQ(a.shared_expert_intermediate_size, b.shared_expert_intermediate_size);
  EXPECT_EQ(a.norm_topk_prob, b.norm_topk_prob);
  EXPECT_EQ(a.num_experts, s.experts);
  EXPECT_EQ(a.rope_interleaved, s.arch == "llama" || s.arch == "mixtral");
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
TEST(GgufHfEquivalence, Qwen3MoeStackedExperts) {
  expect_same_logits({.arch = "qwen3_moe", .experts = 8, .top_k = 3, .dtype = DType::kBF16}, 5);
}
// A block type's stacked experts are split into whole rows: the same logits, bit for bit, as the
// same q8_0 experts stored one tensor each.
TEST(GgufHfEquivalence, StackedQ8_0ExpertsEqualPerExpertTensors) {
  const Spec stacked{.arch = "qwen3_moe", .experts = 8, .top_k = 3, .dtype = DType::kQ8_0};
  Spec separate = stacked;
  separate.per_expert_gguf = true;
  auto weights = random_hf_weights(stacked, 8);
  const std::string dir = testing::make_temp_dir();
  ASSERT_FALSE(dir.empty());
  write_gguf(stacked, weights, dir + "/stacked.gguf");
  write_gguf(separate, weights, dir + "/separate.gguf");
  const std::vector<TokenId> tokens = {3, 14, 15, 92, 65, 35, 89, 79, 32, 38};
  const std::vector<float> a = all_logits(dir + "/stacked.gguf", tokens), b = all_logits(dir + "/separate.gguf", tokens);
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
}
// Bad files are refused at load, naming the tensor or the field: stacked experts that disagree
// with expert_count, a missing expert, more experts per token than experts.
TEST(GgufHfEquivalence, BadMixtureOfExpertsFilesNameTheProblem) {
  const std::string dir = testing::make_temp_dir();
  ASSERT_FALSE(dir.empty());
  int i = 0;
  const auto expect_refused = [&](const Spec& spec, const std::string& drop, const std::string& want) {
    auto weights = random_hf_weights(spec, 9);
    if (!drop.empty()) {
      ASSERT_EQ(weights.erase(drop), 1u);
    }
    const std::string path = dir + "/bad" + std::to_string(i++) + ".gguf";
    write_gguf(spec, weights, path);
    auto r = load_model(path, LoadOptions{});
    ASSERT_FALSE(r.ok()) << want;
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
  };
  expect_refused({.arch = "qwen3_moe", .experts = 6, .top_k = 2, .gguf_expert_count = 8}, "",
                 "tensor blk.0.ffn_down_exps.weight has shape [6, 64, 32], expected [8, rows, cols]");
  expect_refused({.arch = "qwen3_moe", .experts = 6, .top_k = 2, .per_expert_gguf = true},
                 "model.layers.1.mlp.experts.3.up_proj.weight", "missing tensor blk.1.ffn_up.3.weight");
  expect_refused({.arch = "mixtral", .experts = 4, .top_k = 2, .gguf_top_k = 5}, "", "num_experts_per_tok = 5");
}

TEST(GgufHfEquivalence, Qwen2MoeSharedExpert) {
  expect_same_logits({.arch = "qwen2_moe", .experts = 6, .top_k = 2, .shared_inter = 48}, 6);
}
TEST(GgufHfEquivalence, MixtralPermutedRopeF16) {
  expect_same_logits({.arch = "mixtral", .experts = 4, .top_k = 2, .dtype = DType::kF16, .sharded = true}, 7);
}

}  // namespace
}  // namespace pagoda
