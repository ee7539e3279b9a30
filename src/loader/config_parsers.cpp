#include "loader/config_parsers.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <optional>
#include <vector>

#include "base/mapped_file.h"
#include "loader/json_util.h"

namespace pagoda {

using nlohmann::json;
using namespace loader_internal;

namespace {

struct HfArchitecture {
  const char* class_name;  // architectures[0]
  const char* model_type;  // model_type
  const char* architecture;
};
constexpr HfArchitecture kHfArchitectures[] = {
    {"LlamaForCausalLM", "llama", "llama"},
    {"MistralForCausalLM", "mistral", "llama"},
    {"Qwen2ForCausalLM", "qwen2", "qwen2"},
    {"Qwen3ForCausalLM", "qwen3", "qwen3"},
    {"Qwen3MoeForCausalLM", "qwen3_moe", "qwen3_moe"},
    {"Qwen2MoeForCausalLM", "qwen2_moe", "qwen2_moe"},
    {"MixtralForCausalLM", "mixtral", "mixtral"},
};

Result<std::string> hf_architecture(const json& j, const std::string& source) {
  auto it = j.find("architectures");
  if (it != j.end() && !it->is_null()) {
    if (!it->is_array() || it->empty() || !(*it)[0].is_string()) {
      return data_loss(source + ": architectures must be a non-empty array of strings");
    }
    std::string name = (*it)[0].get<std::string>();
    for (const auto& a : kHfArchitectures) {
      if (name == a.class_name) return std::string(a.architecture);
    }
    return unimplemented(source + ": unsupported architecture " + name);
  }
  PAGODA_ASSIGN_OR_RETURN(std::optional<std::string> model_type, json_string(j, "model_type", source));
  if (!model_type) return data_loss(source + ": neither architectures nor model_type is given");
  for (const auto& a : kHfArchitectures) {
    if (*model_type == a.model_type) return std::string(a.architecture);
  }
  return unimplemented(source + ": unsupported model_type " + *model_type);
}

Result<int64_t> required_int(const json& j, const char* key, const std::string& source) {
  PAGODA_ASSIGN_OR_RETURN(std::optional<int64_t> v, json_int(j, key, source));
  if (!v) return data_loss(source + ": missing field " + key);
  return *v;
}

Status hf_rope_scaling(const json& j, const std::string& source, RopeScaling* out) {
  auto it = j.find("rope_scaling");
  if (it == j.end() || it->is_null()) return {};
  if (!it->is_object()) return data_loss(source + ": rope_scaling must be an object or null");
  const json& rs = *it;
  std::string where = source + ": rope_scaling";
  PAGODA_ASSIGN_OR_RETURN(std::optional<std::string> type, json_string(rs, "rope_type", where));
  if (!type) {
    PAGODA_ASSIGN_OR_RETURN(type, json_string(rs, "type", where));
  }
  if (!type) return data_loss(where + " has no rope_type");
  if (*type == "default") return {};
  if (*type != "linear" && *type != "llama3" && *type != "dynamic" && *type != "yarn") {
    return unimplemented(source + ": unsupported rope_scaling type " + *type +
                         " (supported: linear, dynamic, yarn, llama3)");
  }
  PAGODA_ASSIGN_OR_RETURN(std::optional<double> factor, json_number(rs, "factor", where));
  if (!factor) return data_loss(where + " has no factor");
  out->factor = *factor;
  if (*type == "linear") {
    out->type = RopeScaling::Type::kLinear;
    return {};
  }
  if (*type == "dynamic") {
    out->type = RopeScaling::Type::kDynamic;
    return {};
  }
  if (*type == "yarn") {
    out->type = RopeScaling::Type::kYarn;
    // DeepSeek's mscale variant scales differently: refused rather than computed wrong.
    for (const char* k : {"mscale", "mscale_all_dim"}) {
      if (rs.contains(k)) return unimplemented(where + ": yarn with " + k + " is not supported yet");
    }
    PAGODA_ASSIGN_OR_RETURN(std::optional<int64_t> orig, json_int(rs, "original_max_position_embeddings", where));
    PAGODA_ASSIGN_OR_RETURN(std::optional<double> fast, json_number(rs, "beta_fast", where));
    PAGODA_ASSIGN_OR_RETURN(std::optional<double> slow, json_number(rs, "beta_slow", where));
    PAGODA_ASSIGN_OR_RETURN(std::optional<double> attention, json_number(rs, "attention_factor", where));
    if (!orig) {
      // Hugging Face's default: the model's own context (read after this; see the caller).
      PAGODA_ASSIGN_OR_RETURN(orig, json_int(j, "max_position_embeddings", source));
    }
    if (orig) out->original_max_position_embeddings = *orig;
    if (fast) out->beta_fast = *fast;
    if (slow) out->beta_slow = *slow;
    if (attention) out->attention_factor = *attention;
    return {};
  }
  out->type = RopeScaling::Type::kLlama3;
  PAGODA_ASSIGN_OR_RETURN(std::optional<double> low, json_number(rs, "low_freq_factor", where));
  PAGODA_ASSIGN_OR_RETURN(std::optional<double> high, json_number(rs, "high_freq_factor", where));
  PAGODA_ASSIGN_OR_RETURN(std::optional<int64_t> orig,
                          json_int(rs, "original_max_position_embeddings", where));
  if (low) out->low_freq_factor = *low;
  if (high) out->high_freq_factor = *high;
  if (orig) out->original_max_position_embeddings = *orig;
  return {};
}

// Optional GGUF metadata: the value when the key is present, `fallback` when it is not; a key of
// the wrong type is an error.
Result<int64_t> gguf_int_or(const GgufFile& g, const std::string& key, int64_t fallback) {
  if (!g.find(key)) return fallback;
  return g.get_int(key);
}
Result<double> gguf_float_or(const GgufFile& g, const std::string& key, double fallback) {
  if (!g.find(key)) return fallback;
  return g.get_float(key);
}

// llama.cpp stores Llama 3's rope scaling as a per-frequency divisor tensor, rope_freqs.weight
// [head_dim / 2]. Recover the RopeScaling parameters by assuming Meta's published constants
// (low 1, high 4, original context 8192) with the factor read off the tensor, and accept them
// only if they reproduce every divisor.
Status rope_scaling_from_freqs(const GgufFile& g, const GgufTensorInfo& t, ModelConfig* c) {
  const std::string where = g.path() + ": rope_freqs.weight";
  if (t.tensor.dtype != DType::kF32 || t.tensor.ndim != 1 || t.tensor.shape[0] * 2 != c->head_dim) {
    return unimplemented(where + " must be f32 [head_dim / 2]; has " + t.tensor.shape_string() + " " +
                         std::string(dtype_name(t.tensor.dtype)));
  }
  const float* divisors = t.tensor.as<const float>();
  int64_t n = t.tensor.shape[0];
  float factor = *std::max_element(divisors, divisors + n);
  if (!std::isfinite(factor)) {
    return unimplemented(where + " holds rope frequency factors that are not finite");
  }
  RopeScaling rs;
  rs.type = RopeScaling::Type::kLlama3;
  rs.factor = factor;
  double low_wavelen = rs.original_max_position_embeddings / rs.low_freq_factor;
  double high_wavelen = rs.original_max_position_embeddings / rs.high_freq_factor;
  for (int64_t i = 0; i < n; ++i) {
    double freq = std::pow(c->rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c->head_dim));
    double wavelen = 2 * std::numbers::pi / freq;
    double expected;
    if (wavelen < high_wavelen) {
      expected = 1.0;
    } else if (wavelen > low_wavelen) {
      expected = rs.factor;
    } else {
      double smooth = (rs.original_max_position_embeddings / wavelen - rs.low_freq_factor) /
                      (rs.high_freq_factor - rs.low_freq_factor);
      expected = 1.0 / ((1 - smooth) / rs.factor + smooth);
    }
    // Written so that NaN (and inf - inf) fails: a comparison with NaN is always false.
    if (!(std::fabs(divisors[i] - expected) <= 1e-3 * expected)) {
      return unimplemented(where + " holds rope frequency factors that do not match Llama 3 scaling");
    }
  }
  // Factor 1 expects every divisor to be 1 (checked above): no scaling.
  if (factor != 1.0f) c->rope_scaling = rs;
  return {};
}

// A quantization_config field: its value, or `fallback` where it is absent or null.
json config_arg(const json& o, const char* key, const json& fallback) {
  return o.is_object() && o.contains(key) && !o[key].is_null() ? o[key] : fallback;
}

// An integer field that must be one of `allowed` (and an integer).
Result<int64_t> config_int_in(const json& q, std::initializer_list<const char*> keys, int64_t fallback,
                              std::initializer_list<int64_t> allowed, const std::string& where) {
  json v = fallback;
  std::string name = *keys.begin();
  for (const char* k : keys) {
    if (q.contains(k) && !q[k].is_null()) {
      v = q[k];
      name = k;
      break;
    }
  }
  if (!v.is_number_integer()) return data_loss(where + "." + name + " " + v.dump() + " is not an integer");
  const auto x = v.get<int64_t>();
  if (allowed.size() > 0 && std::find(allowed.begin(), allowed.end(), x) == allowed.end()) {
    return unimplemented(where + "." + name + " " + std::to_string(x) + " is not supported");
  }
  return x;
}

// A group size as the formats write it: -1 (or null / 0 where allowed) = per output channel;
// otherwise a positive multiple of 8 (a group is a whole number of packed words).
Result<int64_t> config_group_size(const json& v, const std::string& where) {
  if (v.is_null()) return int64_t{0};
  if (!v.is_number_integer()) return data_loss(where + " " + v.dump() + " is not an integer");
  const auto g = v.get<int64_t>();
  if (g == -1) return int64_t{0};
  if (g <= 0 || g % 8 != 0 || g > (int64_t{1} << 20)) {
    return data_loss(where + " " + std::to_string(g) + " is not -1 or a positive multiple of 8");
  }
  return g;
}

Status ct_int_quantized(const json& groups, const std::string& where, CheckpointQuantization* out) {
  std::optional<bool> dynamic;
  for (const auto& [name, g] : groups.items()) {
    const std::string at = where + ".config_groups." + name;
    if (!g.is_object()) return data_loss(at + " is not an object");
    const json& w = g.contains("weights") ? g["weights"] : json();
    const json& a = g.contains("input_activations") ? g["input_activations"] : json();
    const json strategy = config_arg(w, "strategy", "channel");
    const bool eight = config_arg(w, "num_bits", 8) == 8 && (strategy == "channel" || strategy == "tensor");
    const bool four = config_arg(w, "num_bits", 8) == 4 && (strategy == "group" || strategy == "channel");
    const bool weights_ok = w.is_object() && (eight || four) && config_arg(w, "type", "int") == "int" &&
                            config_arg(w, "symmetric", true) == true && config_arg(w, "actorder", nullptr).is_null();
    if (!weights_ok) {
      return unimplemented(at + ".weights " + (w.is_null() ? std::string("null") : w.dump()) +
                           " is not supported yet (supported: symmetric int, 8-bit per channel or per tensor, 4-bit "
                           "per group or per channel)");
    }
    const int bits = eight ? 8 : 4;
    int64_t group = 0;
    if (four && strategy == "group") {
      PAGODA_ASSIGN_OR_RETURN(group, config_group_size(config_arg(w, "group_size", -1), at + ".weights.group_size"));
    }
    if (out->bits != 0 && (out->bits != bits || out->group_size != group)) {
      return unimplemented(at + ": config groups with different weight schemes are not supported yet");
    }
    out->bits = bits;
    out->group_size = group;
    const bool token = a.is_object() && config_arg(a, "strategy", "token") == "token" && config_arg(a, "dynamic", true) == true;
    const bool tensor = a.is_object() && config_arg(a, "strategy", "") == "tensor" && config_arg(a, "dynamic", false) == false;
    const bool acts_ok = a.is_object() && config_arg(a, "num_bits", 8) == 8 && config_arg(a, "type", "int") == "int" &&
                         config_arg(a, "symmetric", true) == true && (token || tensor);
    if (!acts_ok) {
      return unimplemented(at + ".input_activations " + (a.is_null() ? std::string("null") : a.dump()) +
                           " is not supported yet (supported: 8-bit symmetric int, dynamic per token or static "
                           "per tensor)");
    }
    if (dynamic && *dynamic != token) return unimplemented(at + ": groups mixing dynamic and static activations");
    dynamic = token;
  }
  out->static_input_scales = !*dynamic;
  return {};
}

// pack-quantized: int weights of 4 or 8 bits in groups or per channel, float activations
// (W4A16, W8A16). Every group must describe the same scheme.
Status ct_pack_quantized(const json& groups, const std::string& where, CheckpointQuantization* out) {
  std::optional<CheckpointQuantization> seen;
  for (const auto& [name, g] : groups.items()) {
    const std::string at = where + ".config_groups." + name;
    if (!g.is_object()) return data_loss(at + " is not an object");
    const json& w = g.contains("weights") ? g["weights"] : json();
    const json& a = g.contains("input_activations") ? g["input_activations"] : json();
    if (!w.is_object()) return data_loss(at + ".weights is not an object");
    CheckpointQuantization c = *out;
    const json bits = config_arg(w, "num_bits", 8), type = config_arg(w, "type", "int");
    const json strategy = config_arg(w, "strategy", "");
    const json actorder = config_arg(w, "actorder", nullptr);
    const json sym = config_arg(w, "symmetric", true);
    const bool ok = (bits == 4 || bits == 8) && type == "int" && sym.is_boolean() &&
                    (strategy == "group" || strategy == "channel" || strategy == "") &&
                    (actorder.is_null() || actorder == "group" || actorder == "dynamic" || actorder == "weight" ||
                     actorder == "static") &&
                    a.is_null();
    if (!ok) {
      return unimplemented(at + " weights " + w.dump() + ", input_activations " + a.dump() +
                           " is not supported yet (supported for pack-quantized: 4- or 8-bit int weights per group "
                           "or per channel, symmetric or not, float activations)");
    }
    c.bits = bits.get<int>();
    c.symmetric = sym.get<bool>();
    c.act_order = actorder == "group" || actorder == "dynamic";
    PAGODA_ASSIGN_OR_RETURN(c.group_size, config_group_size(strategy == "channel" ? json(-1) : config_arg(w, "group_size", -1),
                                                            at + ".weights.group_size"));
    if (seen && (seen->bits != c.bits || seen->symmetric != c.symmetric || seen->group_size != c.group_size ||
                 seen->act_order != c.act_order)) {
      return unimplemented(at + ": config groups with different weight schemes are not supported yet");
    }
    seen = c;
  }
  *out = *seen;
  return {};
}

// AutoAWQ's GEMM checkpoints (quantization-formats.md 2): 4-bit, zero points, groups.
Status awq_config(const json& q, const std::string& where, CheckpointQuantization* out) {
  PAGODA_ASSIGN_OR_RETURN(const int64_t bits, config_int_in(q, {"bits", "w_bit"}, 4, {4}, where));
  const json version = config_arg(q, "version", "gemm");
  if (!version.is_string() || (version != "gemm" && version != "GEMM")) {
    return unimplemented(where + ".version " + version.dump() +
                         " is not supported yet (supported: gemm, AutoAWQ's GEMM packing)");
  }
  if (config_arg(q, "zero_point", true) != true) {
    return unimplemented(where + ".zero_point false is not supported (AWQ's GEMM packing stores zero points)");
  }
  json group = q.contains("group_size") ? q["group_size"] : config_arg(q, "q_group_size", 128);
  PAGODA_ASSIGN_OR_RETURN(out->group_size, config_group_size(group, where + ".group_size"));
  out->bits = static_cast<int>(bits);
  out->symmetric = false;
  return {};
}

// GPTQ (AutoGPTQ, GPTQModel, optimum; quantization-formats.md 3): 4 or 8 bits, v1 or v2 zeros.
Status gptq_config(const json& q, const std::string& where, CheckpointQuantization* out) {
  PAGODA_ASSIGN_OR_RETURN(const int64_t bits, config_int_in(q, {"bits"}, 4, {4, 8}, where));
  PAGODA_ASSIGN_OR_RETURN(out->group_size, config_group_size(config_arg(q, "group_size", 128), where + ".group_size"));
  const json format = q.contains("checkpoint_format") ? config_arg(q, "checkpoint_format", "gptq") : config_arg(q, "format", "gptq");
  if (!format.is_string() || (format != "gptq" && format != "gptq_v2")) {
    return unimplemented(where + ".checkpoint_format " + format.dump() +
                         " is not supported yet (supported: gptq, gptq_v2)");
  }
  if (config_arg(q, "is_marlin_format", false) != false) {
    return unimplemented(where + ".is_marlin_format: Marlin-repacked GPTQ is not supported yet");
  }
  const json dynamic = config_arg(q, "dynamic", json::object());
  if (!dynamic.is_object() || !dynamic.empty()) {
    return unimplemented(where + ".dynamic (per-module overrides) is not supported yet");
  }
  const json sym = config_arg(q, "sym", true), desc = config_arg(q, "desc_act", false);
  if (!sym.is_boolean() || !desc.is_boolean()) return data_loss(where + ": sym and desc_act must be true or false");
  out->bits = static_cast<int>(bits);
  out->symmetric = sym.get<bool>();
  out->act_order = desc.get<bool>();
  out->zeros_minus_one = format == "gptq";
  return {};
}

// config.json's quantization_config. Supported: compressed-tensors int-quantized (W8A8) and
// pack-quantized (W4A16 / W8A16), AWQ GEMM, GPTQ; anything else is refused naming what was found.
Status hf_quantization(const json& j, const std::string& source, CheckpointQuantization* out) {
  const auto it = j.find("quantization_config");
  if (it == j.end() || it->is_null()) return {};
  const json& q = *it;
  const std::string where = source + ": quantization_config";
  if (!q.is_object()) return data_loss(where + " is not an object");
  const std::string method =
      q.contains("quant_method") && q["quant_method"].is_string() ? q["quant_method"].get<std::string>() : "";
  CheckpointQuantization c;
  c.method = method;
  if (method == "awq") {
    PAGODA_RETURN_IF_ERROR(awq_config(q, where, &c));
  } else if (method == "gptq") {
    PAGODA_RETURN_IF_ERROR(gptq_config(q, where, &c));
  } else if (method == "compressed-tensors") {
    c.format = q.contains("format") && q["format"].is_string() ? q["format"].get<std::string>() : "";
    if (c.format != "int-quantized" && c.format != "pack-quantized") {
      return unimplemented(where + ": compressed-tensors format " + (c.format.empty() ? std::string("(missing)") : c.format) +
                           " is not supported yet (supported: int-quantized, int8 weights with int8 activations; "
                           "pack-quantized, int4 / int8 weights with float activations)");
    }
    const auto groups = q.find("config_groups");
    if (groups == q.end() || !groups->is_object() || groups->empty()) return data_loss(where + " has no config_groups");
    if (c.format == "int-quantized") {
      PAGODA_RETURN_IF_ERROR(ct_int_quantized(*groups, where, &c));
    } else {
      PAGODA_RETURN_IF_ERROR(ct_pack_quantized(*groups, where, &c));
    }
  } else {
    return unimplemented(where + ": quant_method " + (method.empty() ? std::string("(missing)") : method) +
                         " is not supported yet (supported: awq, gptq, compressed-tensors)");
  }
  *out = c;
  return {};
}

// The mixture-of-experts fields of an HF config, with transformers' defaults where its config
// classes have them: Qwen3MoeConfig / Qwen2MoeConfig (num_experts, num_experts_per_tok,
// moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers, and Qwen2-MoE's
// shared_expert_intermediate_size) and MixtralConfig (num_local_experts experts of
// intermediate_size, the top 2 renormalised).
Status hf_moe(const json& j, const std::string& source, ModelConfig* c) {
  const bool qwen3 = c->architecture == "qwen3_moe", qwen2 = c->architecture == "qwen2_moe";
  if (!qwen3 && !qwen2 && c->architecture != "mixtral") return {};
  auto int_or = [&](const char* key, int64_t fallback) -> Result<int64_t> {
    PAGODA_ASSIGN_OR_RETURN(std::optional<int64_t> v, json_int(j, key, source));
    return v.value_or(fallback);
  };
  if (c->architecture == "mixtral") {
    PAGODA_ASSIGN_OR_RETURN(c->num_experts, int_or("num_local_experts", 8));
    PAGODA_ASSIGN_OR_RETURN(c->num_experts_per_tok, int_or("num_experts_per_tok", 2));
    c->moe_intermediate_size = c->intermediate_size;
    c->norm_topk_prob = true;
    return {};
  }
  PAGODA_ASSIGN_OR_RETURN(c->num_experts, int_or("num_experts", qwen3 ? 128 : 60));
  PAGODA_ASSIGN_OR_RETURN(c->num_experts_per_tok, int_or("num_experts_per_tok", qwen3 ? 8 : 4));
  PAGODA_ASSIGN_OR_RETURN(c->moe_intermediate_size, int_or("moe_intermediate_size", qwen3 ? 768 : 1408));
  if (qwen2) {
    PAGODA_ASSIGN_OR_RETURN(c->shared_expert_intermediate_size, int_or("shared_expert_intermediate_size", 5632));
  }
  PAGODA_ASSIGN_OR_RETURN(std::optional<bool> norm, json_bool(j, "norm_topk_prob", source));
  c->norm_topk_prob = norm.value_or(false);
  PAGODA_ASSIGN_OR_RETURN(c->decoder_sparse_step, int_or("decoder_sparse_step", 1));
  if (auto it = j.find("mlp_only_layers"); it != j.end() && !it->is_null()) {
    if (!it->is_array()) return data_loss(source + ": mlp_only_layers must be an array of layer numbers");
    for (const json& v : *it) {
      if (!v.is_number_integer()) return data_loss(source + ": mlp_only_layers must be an array of layer numbers");
      c->mlp_only_layers.push_back(v.get<int64_t>());
    }
  }
  return {};
}

}  // namespace

Result<ModelConfig> config_from_hf_json(const std::string& json_text, const std::string& source) {
  PAGODA_ASSIGN_OR_RETURN(json j, parse_json(json_text, source));
  if (!j.is_object()) return data_loss(source + ": config is not a JSON object");
  ModelConfig c;
  PAGODA_ASSIGN_OR_RETURN(c.architecture, hf_architecture(j, source));
  PAGODA_ASSIGN_OR_RETURN(c.vocab_size, required_int(j, "vocab_size", source));
  PAGODA_ASSIGN_OR_RETURN(c.hidden_size, required_int(j, "hidden_size", source));
  PAGODA_ASSIGN_OR_RETURN(c.intermediate_size, required_int(j, "intermediate_size", source));
  PAGODA_ASSIGN_OR_RETURN(c.num_layers, required_int(j, "num_hidden_layers", source));
  PAGODA_ASSIGN_OR_RETURN(c.num_heads, required_int(j, "num_attention_heads", source));
  if (c.num_heads <= 0) return data_loss(source + ": num_attention_heads must be positive");
  PAGODA_ASSIGN_OR_RETURN(auto kv_heads, json_int(j, "num_key_value_heads", source));
  c.num_kv_heads = kv_heads.value_or(c.num_heads);
  PAGODA_ASSIGN_OR_RETURN(auto head_dim, json_int(j, "head_dim", source));
  c.head_dim = head_dim.value_or(c.hidden_size / c.num_heads);
  if (!head_dim && c.hidden_size % c.num_heads != 0) {
    return data_loss(source + ": hidden_size is not a multiple of num_attention_heads and head_dim is not given");
  }
  bool is_qwen = c.architecture.starts_with("qwen");
  PAGODA_ASSIGN_OR_RETURN(auto max_pos, json_int(j, "max_position_embeddings", source));
  c.max_position_embeddings = max_pos.value_or(is_qwen ? 32768 : 2048);
  PAGODA_ASSIGN_OR_RETURN(auto eps, json_number(j, "rms_norm_eps", source));
  c.rms_norm_eps = eps.value_or(1e-6);  // transformers' default for all three families
  PAGODA_ASSIGN_OR_RETURN(auto theta, json_number(j, "rope_theta", source));
  c.rope_theta = theta.value_or(10000.0);
  PAGODA_RETURN_IF_ERROR(hf_rope_scaling(j, source, &c.rope_scaling));
  PAGODA_ASSIGN_OR_RETURN(auto tie, json_bool(j, "tie_word_embeddings", source));
  c.tie_word_embeddings = tie.value_or(false);
  PAGODA_ASSIGN_OR_RETURN(auto window, json_int(j, "sliding_window", source));
  PAGODA_ASSIGN_OR_RETURN(auto use_window, json_bool(j, "use_sliding_window", source));
  // Qwen2/3 configs name a window but switch it off with use_sliding_window=false.
  c.sliding_window = use_window.value_or(true) ? window.value_or(0) : 0;
  PAGODA_ASSIGN_OR_RETURN(auto bias, json_bool(j, "attention_bias", source));
  // Qwen2 and Qwen2-MoE always have Q/K/V biases; Qwen3 and Qwen3-MoE per-head q/k norms.
  c.attention_bias = c.architecture == "qwen2" || c.architecture == "qwen2_moe" ? true : bias.value_or(false);
  c.qk_norm = c.architecture == "qwen3" || c.architecture == "qwen3_moe";
  c.rope_interleaved = false;
  PAGODA_ASSIGN_OR_RETURN(auto mlp_bias, json_bool(j, "mlp_bias", source));
  if (mlp_bias.value_or(false)) return unimplemented(source + ": mlp_bias is not supported");
  PAGODA_ASSIGN_OR_RETURN(auto act, json_string(j, "hidden_act", source));
  if (act && *act != "silu") return unimplemented(source + ": unsupported hidden_act " + *act);
  PAGODA_RETURN_IF_ERROR(hf_moe(j, source, &c));
  PAGODA_RETURN_IF_ERROR(hf_quantization(j, source, &c.quantization));
  PAGODA_RETURN_IF_ERROR(c.validate(source));
  return c;
}

Status apply_hf_overrides(const std::string& json_text, const std::string& source, ModelConfig* c) {
  PAGODA_ASSIGN_OR_RETURN(json j, parse_json(json_text, source));
  if (!j.is_object()) return invalid_argument(source + " must be a JSON object, got " + json_text);
  for (const auto& [k, v] : j.items()) {
    if (k != "rope_scaling" && k != "rope_theta" && k != "max_position_embeddings") {
      return unimplemented(source + ": overriding " + k +
                           " is not supported (supported: rope_scaling, rope_theta, max_position_embeddings)");
    }
  }
  ModelConfig out = *c;
  PAGODA_ASSIGN_OR_RETURN(std::optional<int64_t> max_pos, json_int(j, "max_position_embeddings", source));
  if (max_pos) out.max_position_embeddings = *max_pos;
  PAGODA_ASSIGN_OR_RETURN(std::optional<double> theta, json_number(j, "rope_theta", source));
  if (theta) out.rope_theta = *theta;
  if (j.contains("rope_scaling")) {
    // Read as config.json's, with the model's context as yarn's default original length.
    json scaling = {{"rope_scaling", j["rope_scaling"]}, {"max_position_embeddings", out.max_position_embeddings}};
    out.rope_scaling = RopeScaling{};
    PAGODA_RETURN_IF_ERROR(hf_rope_scaling(scaling, source, &out.rope_scaling));
  }
  PAGODA_RETURN_IF_ERROR(out.validate(source));
  *c = out;
  return {};
}

Result<ModelConfig> config_from_hf_file(const std::string& path) {
  PAGODA_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return config_from_hf_json(text, path);
}

Result<ModelConfig> config_from_gguf(const GgufFile& g) {
  const std::string& path = g.path();
  PAGODA_ASSIGN_OR_RETURN(std::string arch, g.get_string("general.architecture"));
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "qwen2moe" && arch != "qwen3moe") {
    return unimplemented(path + ": unsupported architecture " + arch);
  }
  auto key = [&](const char* suffix) { return arch + "." + suffix; };
  ModelConfig c;
  c.architecture = arch == "qwen2moe" ? "qwen2_moe" : arch == "qwen3moe" ? "qwen3_moe" : arch;
  PAGODA_ASSIGN_OR_RETURN(c.hidden_size, g.get_int(key("embedding_length")));
  // Mixtures of experts (llama.cpp's keys): Mixtral is the llama arch with experts, all of
  // intermediate_size; Qwen's MoE files give the experts' width apart. Every layer is sparse.
  PAGODA_ASSIGN_OR_RETURN(c.num_experts, gguf_int_or(g, key("expert_count"), 0));
  if (c.num_experts > 0) {
    if (arch == "llama") c.architecture = "mixtral";
    PAGODA_ASSIGN_OR_RETURN(c.num_experts_per_tok, g.get_int(key("expert_used_count")));
    if (arch == "llama") {
      PAGODA_ASSIGN_OR_RETURN(c.moe_intermediate_size, g.get_int(key("feed_forward_length")));
    } else {
      PAGODA_ASSIGN_OR_RETURN(c.moe_intermediate_size, g.get_int(key("expert_feed_forward_length")));
    }
    PAGODA_ASSIGN_OR_RETURN(c.shared_expert_intermediate_size,
                            gguf_int_or(g, key("expert_shared_feed_forward_length"), 0));
    // llama.cpp renormalises the top k for Mixtral and Qwen3-MoE, not for Qwen2-MoE.
    c.norm_topk_prob = arch != "qwen2moe";
    if (g.find(key("expert_weights_norm"))) {
      PAGODA_ASSIGN_OR_RETURN(c.norm_topk_prob, g.get_bool(key("expert_weights_norm")));
    }
  } else if (arch == "qwen2moe" || arch == "qwen3moe") {
    return data_loss(path + ": " + key("expert_count") + " is missing or 0 in a mixture-of-experts file");
  }
  PAGODA_ASSIGN_OR_RETURN(c.intermediate_size, gguf_int_or(g, key("feed_forward_length"), c.moe_intermediate_size));
  PAGODA_ASSIGN_OR_RETURN(c.num_layers, g.get_int(key("block_count")));
  PAGODA_ASSIGN_OR_RETURN(c.num_heads, g.get_int(key("attention.head_count")));
  if (c.num_heads <= 0) return data_loss(path + ": " + key("attention.head_count") + " must be positive");
  PAGODA_ASSIGN_OR_RETURN(c.num_kv_heads, gguf_int_or(g, key("attention.head_count_kv"), c.num_heads));
  PAGODA_ASSIGN_OR_RETURN(c.head_dim, gguf_int_or(g, key("attention.key_length"), c.hidden_size / c.num_heads));
  PAGODA_ASSIGN_OR_RETURN(int64_t value_len, gguf_int_or(g, key("attention.value_length"), c.head_dim));
  if (value_len != c.head_dim) {
    return unimplemented(path + ": value_length " + std::to_string(value_len) + " differs from key_length " +
                         std::to_string(c.head_dim));
  }
  PAGODA_ASSIGN_OR_RETURN(int64_t rope_dims, gguf_int_or(g, key("rope.dimension_count"), c.head_dim));
  if (rope_dims != c.head_dim) {
    return unimplemented(path + ": partial rotary embeddings (rope.dimension_count " +
                         std::to_string(rope_dims) + " of head_dim " + std::to_string(c.head_dim) +
                         ") are not supported");
  }
  PAGODA_ASSIGN_OR_RETURN(c.max_position_embeddings, gguf_int_or(g, key("context_length"), 2048));
  PAGODA_ASSIGN_OR_RETURN(c.rms_norm_eps, gguf_float_or(g, key("attention.layer_norm_rms_epsilon"), 1e-5));
  PAGODA_ASSIGN_OR_RETURN(c.rope_theta, gguf_float_or(g, key("rope.freq_base"), 10000.0));
  PAGODA_ASSIGN_OR_RETURN(c.sliding_window, gguf_int_or(g, key("attention.sliding_window"), 0));

  // Rope scaling: rope.scaling.type (+ .factor), or the older rope.scale_linear.
  std::string scaling_type = "none";
  if (g.find(key("rope.scaling.type"))) {
    PAGODA_ASSIGN_OR_RETURN(scaling_type, g.get_string(key("rope.scaling.type")));
  }
  PAGODA_ASSIGN_OR_RETURN(double factor, gguf_float_or(g, key("rope.scaling.factor"), 0.0));
  PAGODA_ASSIGN_OR_RETURN(double scale_linear, gguf_float_or(g, key("rope.scale_linear"), 0.0));
  if (scaling_type == "none" && scale_linear != 0.0 && scale_linear != 1.0) {
    scaling_type = "linear";
    factor = scale_linear;
  }
  if (scaling_type == "linear") {
    if (factor != 0.0 && factor != 1.0) {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      c.rope_scaling.factor = factor;
    }
  } else if (scaling_type == "yarn") {
    // llama.cpp's keys for YaRN as its converter writes them from config.json's rope_scaling
    // (factor, original_context_length, and the betas when the checkpoint names them); its ramp
    // and magnitude are Hugging Face's (rope_freqs.h). What would change them is refused.
    if (!g.find(key("rope.scaling.factor"))) {
      return data_loss(path + ": rope scaling type yarn without " + key("rope.scaling.factor"));
    }
    RopeScaling& r = c.rope_scaling;
    r.type = RopeScaling::Type::kYarn;
    r.factor = factor;
    PAGODA_ASSIGN_OR_RETURN(r.original_max_position_embeddings,
                            gguf_int_or(g, key("rope.scaling.original_context_length"), c.max_position_embeddings));
    PAGODA_ASSIGN_OR_RETURN(r.beta_fast, gguf_float_or(g, key("rope.scaling.yarn_beta_fast"), r.beta_fast));
    PAGODA_ASSIGN_OR_RETURN(r.beta_slow, gguf_float_or(g, key("rope.scaling.yarn_beta_slow"), r.beta_slow));
    for (const char* k : {"rope.scaling.attn_factor", "rope.scaling.yarn_ext_factor", "rope.scaling.yarn_attn_factor"}) {
      PAGODA_ASSIGN_OR_RETURN(double v, gguf_float_or(g, key(k), 1.0));
      if (v != 1.0) return unimplemented(path + ": yarn with " + key(k) + " " + std::to_string(v) + " is not supported");
    }
    PAGODA_ASSIGN_OR_RETURN(double log_multiplier, gguf_float_or(g, key("rope.scaling.yarn_log_multiplier"), 0.0));
    if (log_multiplier != 0.0) {
      return unimplemented(path + ": yarn with " + key("rope.scaling.yarn_log_multiplier") +
                           " (DeepSeek's mscale variant) is not supported yet");
    }
  } else if (scaling_type != "none") {
    return unimplemented(path + ": unsupported rope scaling type " + scaling_type + " (supported: none, linear, yarn)");
  }

  // Vocabulary size: explicit, else the tokenizer's, else the embedding's rows.
  if (g.find(key("vocab_size"))) {
    PAGODA_ASSIGN_OR_RETURN(c.vocab_size, g.get_int(key("vocab_size")));
  } else if (const GgufValue* tokens = g.find("tokenizer.ggml.tokens");
             tokens && tokens->type == GgufType::kArray) {
    c.vocab_size = static_cast<int64_t>(std::min<uint64_t>(tokens->count, INT64_MAX));
  } else if (const GgufTensorInfo* embd = g.find_tensor("token_embd.weight")) {
    c.vocab_size = embd->tensor.shape[0];
  } else {
    return data_loss(path + ": cannot tell the vocabulary size (no " + key("vocab_size") +
                     ", tokenizer.ggml.tokens or token_embd.weight)");
  }

  c.rope_interleaved = arch == "llama";
  c.tie_word_embeddings = g.find_tensor("output.weight") == nullptr;
  c.attention_bias = arch == "qwen2" || arch == "qwen2moe" || g.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = arch == "qwen3" || arch == "qwen3moe";
  PAGODA_RETURN_IF_ERROR(c.validate(path));
  if (const GgufTensorInfo* freqs = g.find_tensor("rope_freqs.weight")) {
    if (c.rope_scaling.type != RopeScaling::Type::kNone) {
      return unimplemented(path + ": both rope_freqs.weight and a rope scaling type are given");
    }
    PAGODA_RETURN_IF_ERROR(rope_scaling_from_freqs(g, *freqs, &c));
  }
  return c;
}

}  // namespace pagoda
