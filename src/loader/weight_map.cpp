// WeightMap lookups, the canonical tensor list of a config, and Hugging Face name mapping.
#include <algorithm>
#include <cctype>
#include <string_view>

#include "loader/model_source.h"
#include "loader/packed_names.h"

namespace pagoda {

namespace {

std::string shape_string(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

// Per-block tensor names: Hugging Face suffix after "model.layers.N." -> canonical suffix after
// "blk.N.".
struct BlockName {
  std::string_view hf;
  std::string_view canonical;
};
constexpr BlockName kBlockNames[] = {
    {"input_layernorm.weight", "attn_norm.weight"},
    {"post_attention_layernorm.weight", "ffn_norm.weight"},
    {"self_attn.q_proj.weight", "attn_q.weight"},
    {"self_attn.k_proj.weight", "attn_k.weight"},
    {"self_attn.v_proj.weight", "attn_v.weight"},
    {"self_attn.q_proj.bias", "attn_q.bias"},
    {"self_attn.k_proj.bias", "attn_k.bias"},
    {"self_attn.v_proj.bias", "attn_v.bias"},
    {"self_attn.o_proj.weight", "attn_output.weight"},
    {"self_attn.q_norm.weight", "attn_q_norm.weight"},
    {"self_attn.k_norm.weight", "attn_k_norm.weight"},
    {"mlp.gate_proj.weight", "ffn_gate.weight"},
    {"mlp.up_proj.weight", "ffn_up.weight"},
    {"mlp.down_proj.weight", "ffn_down.weight"},
    // Mixtures of experts: the router, Qwen2-MoE's shared expert and its gate.
    {"mlp.gate.weight", "ffn_gate_inp.weight"},
    {"block_sparse_moe.gate.weight", "ffn_gate_inp.weight"},
    {"mlp.shared_expert.gate_proj.weight", "ffn_gate_shexp.weight"},
    {"mlp.shared_expert.up_proj.weight", "ffn_up_shexp.weight"},
    {"mlp.shared_expert.down_proj.weight", "ffn_down_shexp.weight"},
    {"mlp.shared_expert_gate.weight", "ffn_gate_inp_shexp.weight"},
};
// Expert e's projections: "<prefix>e.<hf>" -> "ffn_<canonical>.e.weight" (Qwen's and Mixtral's).
struct ExpertName {
  std::string_view prefix, hf, canonical;
};
constexpr ExpertName kExpertNames[] = {
    {"mlp.experts.", "gate_proj.weight", "ffn_gate"},
    {"mlp.experts.", "up_proj.weight", "ffn_up"},
    {"mlp.experts.", "down_proj.weight", "ffn_down"},
    {"block_sparse_moe.experts.", "w1.weight", "ffn_gate"},
    {"block_sparse_moe.experts.", "w3.weight", "ffn_up"},
    {"block_sparse_moe.experts.", "w2.weight", "ffn_down"},
};
struct GlobalName {
  std::string_view hf;
  std::string_view canonical;
};
constexpr GlobalName kGlobalNames[] = {
    {"model.embed_tokens.weight", "token_embd.weight"},
    {"model.norm.weight", "output_norm.weight"},
    {"lm_head.weight", "output.weight"},
};

// Splits "<prefix>N.<rest>" into N (digits) and rest; false when `name` does not match.
bool split_block(std::string_view name, std::string_view prefix, std::string_view* layer,
                 std::string_view* rest) {
  if (!name.starts_with(prefix)) return false;
  name.remove_prefix(prefix.size());
  size_t digits = 0;
  while (digits < name.size() && std::isdigit(static_cast<unsigned char>(name[digits]))) ++digits;
  if (digits == 0 || digits > 9 || digits >= name.size() || name[digits] != '.') return false;
  *layer = name.substr(0, digits);
  *rest = name.substr(digits + 1);
  return true;
}

}  // namespace

void WeightMap::add(std::string name, Tensor t, std::shared_ptr<const void> owner) {
  tensor_owners_[name] = std::move(owner);
  tensors_[std::move(name)] = t;
}

void WeightMap::release(const std::string& name) {
  tensors_.erase(name);
  tensor_owners_.erase(name);
}

const Tensor* WeightMap::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

Result<Tensor> WeightMap::get(const std::string& name, std::initializer_list<int64_t> shape) const {
  return get(name, std::span<const int64_t>(shape.begin(), shape.size()));
}

Result<Tensor> WeightMap::get(const std::string& name, std::span<const int64_t> shape) const {
  const Tensor* t = find(name);
  if (!t) return not_found(source_ + ": missing tensor " + name);
  bool same = t->ndim == static_cast<int>(shape.size()) &&
              std::equal(shape.begin(), shape.end(), t->shape.begin());
  if (!same) {
    return data_loss(source_ + ": tensor " + name + " has shape " + t->shape_string() +
                     ", expected " + shape_string(shape));
  }
  return *t;
}

std::vector<WeightSpec> expected_weights(const ModelConfig& c) {
  using Kind = WeightSpec::Kind;
  std::vector<WeightSpec> out;
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  out.push_back({"token_embd.weight", {c.vocab_size, c.hidden_size}, Kind::kMatrix});
  if (!c.tie_word_embeddings) {
    out.push_back({"output.weight", {c.vocab_size, c.hidden_size}, Kind::kMatrix});
  }
  out.push_back({"output_norm.weight", {c.hidden_size}, Kind::kNorm});
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    std::string p = "blk." + std::to_string(layer) + ".";
    out.push_back({p + "attn_norm.weight", {c.hidden_size}, Kind::kNorm});
    out.push_back({p + "attn_q.weight", {q_dim, c.hidden_size}, Kind::kMatrix});
    out.push_back({p + "attn_k.weight", {kv_dim, c.hidden_size}, Kind::kMatrix});
    out.push_back({p + "attn_v.weight", {kv_dim, c.hidden_size}, Kind::kMatrix});
    if (c.attention_bias) {
      out.push_back({p + "attn_q.bias", {q_dim}, Kind::kBias});
      out.push_back({p + "attn_k.bias", {kv_dim}, Kind::kBias});
      out.push_back({p + "attn_v.bias", {kv_dim}, Kind::kBias});
    }
    if (c.qk_norm) {
      out.push_back({p + "attn_q_norm.weight", {c.head_dim}, Kind::kNorm});
      out.push_back({p + "attn_k_norm.weight", {c.head_dim}, Kind::kNorm});
    }
    out.push_back({p + "attn_output.weight", {c.hidden_size, q_dim}, Kind::kMatrix});
    out.push_back({p + "ffn_norm.weight", {c.hidden_size}, Kind::kNorm});
    if (!c.is_sparse_layer(layer)) {
      out.push_back({p + "ffn_gate.weight", {c.intermediate_size, c.hidden_size}, Kind::kMatrix});
      out.push_back({p + "ffn_up.weight", {c.intermediate_size, c.hidden_size}, Kind::kMatrix});
      out.push_back({p + "ffn_down.weight", {c.hidden_size, c.intermediate_size}, Kind::kMatrix});
      continue;
    }
    // A sparse layer: the router, expert e's gated MLP as blk.N.ffn_{gate,up,down}.e.weight (GGUF's
    // stacked ffn_*_exps tensors are split into these at load), and Qwen2-MoE's shared expert.
    const int64_t inter = c.moe_intermediate_size;
    out.push_back({p + "ffn_gate_inp.weight", {c.num_experts, c.hidden_size}, Kind::kMatrix});
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const std::string x = "." + std::to_string(e) + ".weight";
      out.push_back({p + "ffn_gate" + x, {inter, c.hidden_size}, Kind::kMatrix});
      out.push_back({p + "ffn_up" + x, {inter, c.hidden_size}, Kind::kMatrix});
      out.push_back({p + "ffn_down" + x, {c.hidden_size, inter}, Kind::kMatrix});
    }
    if (c.shared_expert_intermediate_size > 0) {
      const int64_t shared = c.shared_expert_intermediate_size;
      out.push_back({p + "ffn_gate_inp_shexp.weight", {1, c.hidden_size}, Kind::kMatrix});
      out.push_back({p + "ffn_gate_shexp.weight", {shared, c.hidden_size}, Kind::kMatrix});
      out.push_back({p + "ffn_up_shexp.weight", {shared, c.hidden_size}, Kind::kMatrix});
      out.push_back({p + "ffn_down_shexp.weight", {c.hidden_size, shared}, Kind::kMatrix});
    }
  }
  return out;
}

Status check_weights(const ModelConfig& config, const WeightMap& weights) {
  for (const WeightSpec& spec : expected_weights(config)) {
    // A projection stored packed (AWQ, GPTQ, ...) is checked where it is decoded (packed_linear.h).
    if (spec.kind == WeightSpec::Kind::kMatrix && weights.find(spec.name) == nullptr &&
        has_packed_linear(weights, spec.name, config.quantization)) {
      continue;
    }
    PAGODA_ASSIGN_OR_RETURN(Tensor t, weights.get(spec.name, spec.shape));
    if (spec.kind != WeightSpec::Kind::kMatrix && t.dtype != DType::kF32 && t.dtype != DType::kF16 &&
        t.dtype != DType::kBF16) {
      return data_loss(weights.source() + ": tensor " + spec.name + " has type " +
                       std::string(dtype_name(t.dtype)) + "; norms and biases must be f32, f16 or bf16");
    }
    if (t.data == nullptr) return data_loss(weights.source() + ": tensor " + spec.name + " has no data");
  }
  return {};
}

namespace {

// The per-tensor quantization parameters a checkpoint stores beside a projection's weight, or in
// its place (compressed-tensors: "q_proj.weight_scale", "q_proj.input_scale", "weight_packed",
// ...; AWQ and GPTQ: "q_proj.qweight", "q_proj.scales", ...): the weight's own name with this
// suffix in place of "weight", in both naming schemes.
constexpr std::string_view kWeightCompanions[] = {
    "weight_scale", "input_scale", "weight_packed", "weight_shape", "weight_zero_point", "weight_g_idx",
    "qweight",      "qzeros",      "scales",        "g_idx"};

// For a name ending in ".<companion>": the name of the weight it belongs to, and the companion.
bool split_companion(const std::string& name, std::string* weight, std::string_view* companion) {
  for (std::string_view c : kWeightCompanions) {
    const std::string suffix = "." + std::string(c);
    if (name.size() > suffix.size() && name.ends_with(suffix)) {
      *weight = name.substr(0, name.size() - c.size()) + "weight";
      *companion = c;
      return true;
    }
  }
  return false;
}

// name, a mapped weight's name ending in "weight", with its companion suffix in place of "weight".
std::string with_companion(const std::string& name, std::string_view companion) {
  return name.substr(0, name.size() - 6) + std::string(companion);
}

}  // namespace

std::optional<std::string> canonical_name_from_hf(const std::string& hf_name) {
  std::string weight;
  std::string_view companion;
  if (split_companion(hf_name, &weight, &companion)) {
    const std::optional<std::string> canonical = canonical_name_from_hf(weight);
    if (!canonical) return std::nullopt;
    return with_companion(*canonical, companion);
  }
  for (const GlobalName& g : kGlobalNames) {
    if (hf_name == g.hf) return std::string(g.canonical);
    // Checkpoints saved from the bare model (not *ForCausalLM) lack the "model." prefix.
    if (g.hf.starts_with("model.") && hf_name == g.hf.substr(6)) return std::string(g.canonical);
  }
  std::string_view layer, rest;
  if (!split_block(hf_name, "model.layers.", &layer, &rest) &&
      !split_block(hf_name, "layers.", &layer, &rest)) {
    return std::nullopt;
  }
  for (const BlockName& b : kBlockNames) {
    if (rest == b.hf) return "blk." + std::string(layer) + "." + std::string(b.canonical);
  }
  for (const ExpertName& x : kExpertNames) {
    std::string_view expert, tail;
    if (split_block(rest, x.prefix, &expert, &tail) && tail == x.hf) {
      return "blk." + std::string(layer) + "." + std::string(x.canonical) + "." + std::string(expert) + ".weight";
    }
  }
  return std::nullopt;
}

std::optional<std::string> hf_name_from_canonical(const std::string& canonical_name) {
  std::string weight;
  std::string_view companion;
  if (split_companion(canonical_name, &weight, &companion)) {
    const std::optional<std::string> hf = hf_name_from_canonical(weight);
    if (!hf) return std::nullopt;
    return with_companion(*hf, companion);
  }
  for (const GlobalName& g : kGlobalNames) {
    if (canonical_name == g.canonical) return std::string(g.hf);
  }
  std::string_view layer, rest;
  if (!split_block(canonical_name, "blk.", &layer, &rest)) return std::nullopt;
  for (const BlockName& b : kBlockNames) {
    if (rest == b.canonical) return "model.layers." + std::string(layer) + "." + std::string(b.hf);
  }
  return std::nullopt;
}

}  // namespace pagoda
