#include "loader/packed_names.h"

namespace pagoda {
namespace {

constexpr PackedNames kAwqGptqNames{"qweight", "qzeros", "scales", "g_idx"};
constexpr PackedNames kCompressedNames{"weight_packed", "weight_zero_point", "weight_scale", "weight_g_idx"};

}  // namespace

const PackedNames& packed_names(const CheckpointQuantization& q) {
  return q.method == "compressed-tensors" ? kCompressedNames : kAwqGptqNames;
}

std::string companion_name(const std::string& weight_name, const char* companion) {
  return weight_name.substr(0, weight_name.size() - 6) + companion;  // "...attn_q." + companion
}

bool has_packed_linear(const WeightMap& weights, const std::string& weight_name, const CheckpointQuantization& q) {
  const bool awq_gptq = q.method == "awq" || q.method == "gptq";
  const bool packed_compressed = q.method == "compressed-tensors" && q.format == "pack-quantized";
  if (!awq_gptq && !packed_compressed) return false;
  return weights.find(companion_name(weight_name, packed_names(q).codes)) != nullptr;
}

}  // namespace pagoda
