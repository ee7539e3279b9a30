#include "model/layers/rope_freqs.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace pagoda {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int64_t half = c.head_dim / 2;
  const double dim = static_cast<double>(c.head_dim);
  std::vector<float> out(static_cast<size_t>(half));
  const RopeScaling& s = c.rope_scaling;
  double base = c.rope_theta;
  if (s.type == RopeScaling::Type::kDynamic) {
    // vLLM's DynamicNTKScalingRotaryEmbedding: the base for a context of max_position * factor.
    base *= std::pow(s.factor * s.factor - (s.factor - 1), dim / (dim - 2));
  }
  // yarn: the dimensions that turn fewer than beta_slow times over the original context are
  // interpolated (divided by the factor), those that turn more than beta_fast times kept, and a
  // linear ramp between (Hugging Face's _compute_yarn_parameters, truncated bounds).
  double ramp_low = 0, ramp_high = 1;
  if (s.type == RopeScaling::Type::kYarn) {
    const double orig = static_cast<double>(s.original_max_position_embeddings);
    auto correction_dim = [&](double rotations) {
      return dim * std::log(orig / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
    };
    ramp_low = std::max(0.0, std::floor(correction_dim(s.beta_fast)));
    ramp_high = std::min(dim - 1, std::ceil(correction_dim(s.beta_slow)));
    if (ramp_low == ramp_high) ramp_high += 0.001;
  }
  for (int64_t i = 0; i < half; ++i) {
    double freq = std::pow(base, -2.0 * static_cast<double>(i) / dim);
    switch (s.type) {
      case RopeScaling::Type::kNone:
      case RopeScaling::Type::kDynamic:
        break;
      case RopeScaling::Type::kYarn: {
        const double ramp = std::clamp((static_cast<double>(i) - ramp_low) / (ramp_high - ramp_low), 0.0, 1.0);
        const double extrapolation = 1 - ramp;  // the share kept as it is
        freq = freq / s.factor * (1 - extrapolation) + freq * extrapolation;
        break;
      }
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
