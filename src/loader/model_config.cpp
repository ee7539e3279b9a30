#include "loader/model_config.h"

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

int64_t ModelConfig::num_parameters() const {
  int64_t q_dim = num_heads * head_dim;
  int64_t kv_dim = num_kv_heads * head_dim;
  int64_t per_layer = 2 * hidden_size                                 // attn_norm, ffn_norm
                      + hidden_size * (q_dim + 2 * kv_dim)            // q, k, v
                      + q_dim * hidden_size                           // o
                      + 3 * hidden_size * intermediate_size;          // gate, up, down
  if (attention_bias) per_layer += q_dim + 2 * kv_dim;
  if (qk_norm) per_layer += 2 * head_dim;
  int64_t embeddings = vocab_size * hidden_size * (tie_word_embeddings ? 1 : 2);
  return embeddings + hidden_size + num_layers * per_layer;
}

}  // namespace pagoda
