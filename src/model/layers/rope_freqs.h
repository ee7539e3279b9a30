// The rotary embedding's per-pair inverse frequencies, with the scalings models declare.
#pragma once

#include <vector>

#include "loader/model_config.h"

namespace pagoda {

// inv_freq[i] = theta^(-2i / head_dim) for i < head_dim / 2, adjusted for config.rope_scaling:
// linear divides every frequency by the factor; llama3 divides only the low frequencies and
// blends the band between them (Llama 3.1's formula); dynamic raises theta for the longest
// context (vLLM's NTK form); yarn blends interpolation and extrapolation along a ramp over the
// dimensions (its attention scaling is RopeScaling::attention_scale, applied by the attention).
std::vector<float> rope_inv_freq(const ModelConfig& config);

}  // namespace pagoda
