#include "loader/model_config.h"

#include <algorithm>
#include <cmath>

namespace pagoda {

namespace {

// Upper bounds chosen so that every size derived from a config (e.g. layers * inter * hidden * 3,
// vocab * hidden) fits comfortably in int64.
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxHidden = int64_t{1} << 20;
constexpr int64_t kMaxIntermediate = int64_t{1} << 22;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxPositions = int64_t{1} << 26;
constexpr int64_t kMaxExperts = 1024;

}  // namespace

Status ModelConfig::validate(const std::string& source) const {
  auto bad = [&](const std::string& what) {
    return invalid_argument(source + ": invalid model config: " + what);
  };
  auto in_range = [&](const char* name, int64_t v, int64_t lo, int64_t hi) -> Status {
    if (v < lo || v > hi) {
      return bad(std::string(name) + " = " + std::to_string(v) + " is outside [" +
                 std::to_string(lo) + ", " + std::to_string(hi) + "]");
    }
    return {};
  };
  if (architecture.empty()) return bad("no architecture");
  PAGODA_RETURN_IF_ERROR(in_range("vocab_size", vocab_size, 1, kMaxVocab));
  PAGODA_RETURN_IF_ERROR(in_range("hidden_size", hidden_size, 1, kMaxHidden));
  PAGODA_RETURN_IF_ERROR(in_range("intermediate_size", intermediate_size, 1, kMaxIntermediate));
  PAGODA_RETURN_IF_ERROR(in_range("num_layers", num_layers, 1, kMaxLayers));
  PAGODA_RETURN_IF_ERROR(in_range("num_heads", num_heads, 1, kMaxHeads));
  PAGODA_RETURN_IF_ERROR(in_range("num_kv_heads", num_kv_heads, 1, num_heads));
  PAGODA_RETURN_IF_ERROR(in_range("head_dim", head_dim, 2, kMaxHeadDim));
  PAGODA_RETURN_IF_ERROR(in_range("max_position_embeddings", max_position_embeddings, 1, kMaxPositions));
  PAGODA_RETURN_IF_ERROR(in_range("sliding_window", sliding_window, 0, kMaxPositions));
  if (num_heads % num_kv_heads != 0) {
    return bad("num_heads (" + std::to_string(num_heads) + ") is not a multiple of num_kv_heads (" +
               std::to_string(num_kv_heads) + ")");
  }
  if (head_dim % 2 != 0) return bad("head_dim " + std::to_string(head_dim) + " is odd");
  PAGODA_RETURN_IF_ERROR(in_range("num_experts", num_experts, 0, kMaxExperts));
  if (num_experts > 0) {
    PAGODA_RETURN_IF_ERROR(in_range("num_experts_per_tok", num_experts_per_tok, 1, num_experts));
    PAGODA_RETURN_IF_ERROR(in_range("moe_intermediate_size", moe_intermediate_size, 1, kMaxIntermediate));
    PAGODA_RETURN_IF_ERROR(
        in_range("shared_expert_intermediate_size", shared_expert_intermediate_size, 0, kMaxIntermediate));
    PAGODA_RETURN_IF_ERROR(in_range("decoder_sparse_step", decoder_sparse_step, 1, num_layers));
    for (int64_t layer : mlp_only_layers) PAGODA_RETURN_IF_ERROR(in_range("mlp_only_layers[i]", layer, 0, num_layers - 1));
  }
  if (num_heads * head_dim > kMaxHidden) {
    return bad("num_heads * head_dim = " + std::to_string(num_heads * head_dim) + " is too large");
  }
  if (!(rms_norm_eps > 0 && rms_norm_eps < 1)) {
    return bad("rms_norm_eps " + std::to_string(rms_norm_eps) + " is not in (0, 1)");
  }
  if (!(rope_theta > 0 && std::isfinite(rope_theta))) {
    return bad("rope_theta " + std::to_string(rope_theta) + " is not a positive number");
  }
  const RopeScaling& rs = rope_scaling;
  if (rs.type != RopeScaling::Type::kNone) {
    if (!(rs.factor > 0 && std::isfinite(rs.factor))) {
      return bad("rope_scaling factor " + std::to_string(rs.factor) + " is not a positive number");
    }
  }
  if (rs.type == RopeScaling::Type::kYarn) {
    if (!(rs.beta_fast > rs.beta_slow && rs.beta_slow > 0 && std::isfinite(rs.beta_fast))) {
      return bad("yarn rope_scaling needs beta_fast > beta_slow > 0");
    }
    if (!(rs.attention_factor >= 0 && std::isfinite(rs.attention_factor))) {
      return bad("yarn rope_scaling attention_factor " + std::to_string(rs.attention_factor) + " is not >= 0");
    }
    PAGODA_RETURN_IF_ERROR(in_range("rope_scaling.original_max_position_embeddings",
                                    rs.original_max_position_embeddings, 1, kMaxPositions));
  }
  if (rs.type == RopeScaling::Type::kLlama3) {
    if (!(rs.low_freq_factor > 0 && std::isfinite(rs.low_freq_factor)) ||
        !(rs.high_freq_factor > rs.low_freq_factor && std::isfinite(rs.high_freq_factor))) {
      return bad("llama3 rope_scaling needs 0 < low_freq_factor < high_freq_factor");
    }
    PAGODA_RETURN_IF_ERROR(in_range("rope_scaling.original_max_position_embeddings",
                                    rs.original_max_position_embeddings, 1, kMaxPositions));
  }
  return {};
}

double RopeScaling::attention_scale() const {
  if (type != Type::kYarn) return 1.0;
  const double a = attention_factor > 0 ? attention_factor : factor <= 1 ? 1.0 : 0.1 * std::log(factor) + 1.0;
  return a * a;
}

int64_t ModelConfig::max_context_len() const {
  const RopeScaling& s = rope_scaling;
  double n = static_cast<double>(max_position_embeddings);
  if (s.type == RopeScaling::Type::kLinear || s.type == RopeScaling::Type::kDynamic) n *= s.factor;
  if (s.type == RopeScaling::Type::kYarn) n = static_cast<double>(s.original_max_position_embeddings) * s.factor;
  return static_cast<int64_t>(std::clamp(n, 1.0, static_cast<double>(kMaxPositions)));
}

bool ModelConfig::is_sparse_layer(int64_t layer) const {
  layer += first_layer;
  if (num_experts <= 0 || decoder_sparse_step <= 0 || (layer + 1) % decoder_sparse_step != 0) return false;
  for (int64_t l : mlp_only_layers) {
    if (l == layer) return false;
  }
  return true;
}

int64_t ModelConfig::max_intermediate_size() const {
  int64_t widest = 0;
  for (int64_t layer = 0; layer < num_layers; ++layer) {
    widest = std::max(widest, is_sparse_layer(layer) ? std::max(moe_intermediate_size, shared_expert_intermediate_size)
                                                     : intermediate_size);
  }
  return widest;
}

namespace {

// Parameters of the model with `experts` of each sparse layer's experts counted.
int64_t count_parameters(const ModelConfig& c, int64_t experts) {
  const int64_t q_dim = c.num_heads * c.head_dim;
  const int64_t kv_dim = c.num_kv_heads * c.head_dim;
  const int64_t h = c.hidden_size;
  int64_t total = c.vocab_size * h * (c.tie_word_embeddings ? 1 : 2) + h;
  for (int64_t layer = 0; layer < c.num_layers; ++layer) {
    total += 2 * h                           // attn_norm, ffn_norm
             + h * (q_dim + 2 * kv_dim)      // q, k, v
             + q_dim * h;                    // o
    if (c.attention_bias) total += q_dim + 2 * kv_dim;
    if (c.qk_norm) total += 2 * c.head_dim;
    if (!c.is_sparse_layer(layer)) {
      total += 3 * h * c.intermediate_size;  // gate, up, down
      continue;
    }
    total += c.num_experts * h + experts * 3 * h * c.moe_intermediate_size;  // router, experts
    if (c.shared_expert_intermediate_size > 0) total += h + 3 * h * c.shared_expert_intermediate_size;
  }
  return total;
}

}  // namespace

int64_t ModelConfig::num_parameters() const { return count_parameters(*this, num_experts); }

int64_t ModelConfig::num_active_parameters() const { return count_parameters(*this, num_experts_per_tok); }

}  // namespace pagoda
