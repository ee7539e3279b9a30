#pragma once
// How an AWQ, GPTQ or compressed-tensors checkpoint names a packed projection's tensors: the
// canonical weight's name ("blk.0.attn_q.weight") with a companion in place of "weight"
// ("blk.0.attn_q.qweight", "blk.0.attn_q.weight_scale"). The loader checks a checkpoint against
// these names; model/quant/packed_linear.h decodes what they hold.
#include <string>

#include "loader/model_config.h"
#include "loader/model_source.h"

namespace pagoda {

struct PackedNames {
  const char* codes;
  const char* zeros;
  const char* scales;
  const char* g_idx;
};

// AWQ / GPTQ: "qweight", "qzeros", "scales", "g_idx"; compressed-tensors: "weight_packed",
// "weight_zero_point", "weight_scale", "weight_g_idx".
const PackedNames& packed_names(const CheckpointQuantization& q);

// weight_name (ending in "weight") with `companion` in its place.
std::string companion_name(const std::string& weight_name, const char* companion);

// Whether the checkpoint stores the projection `weight_name` in q's packed format (its
// "qweight" or "weight_packed" is present).
bool has_packed_linear(const WeightMap& weights, const std::string& weight_name, const CheckpointQuantization& q);

}  // namespace pagoda
