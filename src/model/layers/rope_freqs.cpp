#include "model/layers/rope_freqs.h"

#include <cmath>
#include <numbers>

namespace pagoda {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  const RopeScaling& s = c.rope_scaling;
  for (int64_t i = 0; i < half; ++i) {
    double freq = std::pow(c.rope_theta, -2.0 * static_cast<double>(i) / static_cast<double>(c.head_dim));
    switch (s.type) {
      case RopeScaling::Type::kNone:
        break;
      case RopeScaling::Type::kLinear:
        freq /= s.factor;
        break;
      case RopeScaling::Type::kLlama3: {
        const double orig = static_cast<double>(s.original_max_position_embeddings);
        const double wavelen = 2 * std::numbers::pi / freq;
        const double low_freq_wavelen = orig / s.low_freq_factor;
        const double high_freq_wavelen = orig / s.high_freq_factor;
        if (wavelen > low_freq_wavelen) {
          freq /= s.factor;
        } else if (wavelen >= high_freq_wavelen) {
          double smooth = (orig / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          freq = (1 - smooth) * freq / s.factor + smooth * freq;
        }
        break;
      }
    }
    out[static_cast<size_t>(i)] = static_cast<float>(freq);
  }
  return out;
}

}  // namespace pagoda
