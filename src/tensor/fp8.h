// The two 8-bit float formats of vLLM's fp8 KV cache (and of FP8 checkpoints), as PyTorch's
// float8_e4m3fn and float8_e5m2 define them:
//  - E4M3 ("fn": finite): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, NaN is
//    S.1111.111; largest finite 448; subnormals m / 8 * 2^-6.
//  - E5M2: sign, 5 exponent bits (bias 15), 2 mantissa bits, the top byte of an IEEE fp16:
//    infinities and NaNs as fp16 has them; largest finite 57344.
// Encoding rounds to nearest even and saturates to the largest finite value (CUDA's
// __NV_SATFINITE, what vLLM's conversions use); NaN stays NaN. Pure functions; thread-safe.
#pragma once

#include <cstdint>

namespace pagoda {

inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp8E5M2Max = 57344.0f;

float fp8_e4m3_to_f32(uint8_t v);
float fp8_e5m2_to_f32(uint8_t v);
uint8_t f32_to_fp8_e4m3(float x);
uint8_t f32_to_fp8_e5m2(float x);

// All 256 values of each format, for table-driven decoding in kernels.
const float* fp8_e4m3_table();
const float* fp8_e5m2_table();

}  // namespace pagoda
