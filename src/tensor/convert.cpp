#include "tensor/convert.h"

#include <cmath>
#include <cstring>

#include "base/check.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace pagoda {

void dequantize_row(DType t, const void* src, float* out, int64_t n) {
  dtype_traits(t).dequantize_row(src, out, n);
}

void quantize_row(DType t, const float* src, void* dst, int64_t n) {
  dtype_traits(t).quantize_row(src, dst, n);
}

void dequantize_row_f32(const void* src, float* out, int64_t n) {
  std::memcpy(out, src, static_cast<size_t>(n) * 4);
}

void dequantize_row_f16(const void* src, float* out, int64_t n) {
  auto* p = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) out[i] = fp16_to_f32(p[i]);
}

void dequantize_row_bf16(const void* src, float* out, int64_t n) {
  auto* p = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_f32(p[i]);
}

void dequantize_row_q8_0(const void* src, float* out, int64_t n) {
  PAGODA_CHECK(n % kQuantBlock == 0);
  auto* blocks = static_cast<const BlockQ8_0*>(src);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    float d = fp16_to_f32(blocks[b].d);
    for (int j = 0; j < kQuantBlock; ++j) out[b * kQuantBlock + j] = d * blocks[b].qs[j];
  }
}

void dequantize_row_q4_0(const void* src, float* out, int64_t n) {
  PAGODA_CHECK(n % kQuantBlock == 0);
  auto* blocks = static_cast<const BlockQ4_0*>(src);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    float d = fp16_to_f32(blocks[b].d);
    float* o = out + b * kQuantBlock;
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      o[j] = d * ((blocks[b].qs[j] & 0x0f) - 8);
      o[j + kQuantBlock / 2] = d * ((blocks[b].qs[j] >> 4) - 8);
    }
  }
}

void dequantize_row_i8(const void* src, float* out, int64_t n) {
  auto* p = static_cast<const int8_t*>(src);
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(p[i]);
}

void quantize_row_i8(const float* src, void* dst, int64_t n) {
  auto* p = static_cast<int8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const float v = std::nearbyint(src[i]);
    p[i] = static_cast<int8_t>(v > 127.0f ? 127 : (v < -128.0f ? -128 : v));
  }
}

void dequantize_row_i32(const void* src, float* out, int64_t n) {
  auto* p = static_cast<const uint8_t*>(src);  // any alignment
  for (int64_t i = 0; i < n; ++i) {
    int32_t v;
    std::memcpy(&v, p + 4 * i, 4);
    out[i] = static_cast<float>(v);
  }
}

void quantize_row_i32(const float* src, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const double v = std::nearbyint(static_cast<double>(src[i]));
    const auto q = static_cast<int32_t>(v > 2147483647.0 ? 2147483647.0 : (v < -2147483648.0 ? -2147483648.0 : v));
    std::memcpy(p + 4 * i, &q, 4);
  }
}

void dequantize_row_i64(const void* src, float* out, int64_t n) {
  auto* p = static_cast<const uint8_t*>(src);
  for (int64_t i = 0; i < n; ++i) {
    int64_t v;
    std::memcpy(&v, p + 8 * i, 8);
    out[i] = static_cast<float>(v);
  }
}

void quantize_row_i64(const float* src, void* dst, int64_t n) {
  auto* p = static_cast<uint8_t*>(dst);
  for (int64_t i = 0; i < n; ++i) {
    const double v = std::nearbyint(static_cast<double>(src[i]));
    const auto q = static_cast<int64_t>(v > 9.2e18 ? 9.2e18 : (v < -9.2e18 ? -9.2e18 : v));
    std::memcpy(p + 8 * i, &q, 8);
  }
}

void quantize_row_f32(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * 4);
}

void quantize_row_f16(const float* src, void* dst, int64_t n) {
  auto* p = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) p[i] = f32_to_fp16(src[i]);
}

void quantize_row_bf16(const float* src, void* dst, int64_t n) {
  auto* p = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) p[i] = f32_to_bf16(src[i]);
}

void quantize_row_q8_0(const float* src, void* dst, int64_t n) {
  PAGODA_CHECK(n % kQuantBlock == 0);
  auto* blocks = static_cast<BlockQ8_0*>(dst);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* x = src + b * kQuantBlock;
    float amax = 0;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    float d = amax / 127.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_fp16(d);
    for (int j = 0; j < kQuantBlock; ++j) {
      blocks[b].qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
    }
  }
}

void quantize_row_q4_0(const float* src, void* dst, int64_t n) {
  PAGODA_CHECK(n % kQuantBlock == 0);
  auto* blocks = static_cast<BlockQ4_0*>(dst);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* x = src + b * kQuantBlock;
    // The value of largest magnitude maps to -8, so its sign is kept exactly.
    float amax = 0, max = 0;
    for (int j = 0; j < kQuantBlock; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    float d = max / -8.0f;
    float id = d != 0 ? 1.0f / d : 0.0f;
    blocks[b].d = f32_to_fp16(d);
    for (int j = 0; j < kQuantBlock / 2; ++j) {
      auto q = [&](float v) {
        int i = static_cast<int>(v * id + 8.5f);
        return static_cast<uint8_t>(i < 0 ? 0 : (i > 15 ? 15 : i));
      };
      blocks[b].qs[j] = static_cast<uint8_t>(q(x[j]) | q(x[j + kQuantBlock / 2]) << 4);
    }
  }
}

void quantize_activation_row(const float* src, BlockQ8Act* dst, int64_t n) {
  PAGODA_CHECK(n % kQuantBlock == 0);
  for (int64_t b = 0; b < n / kQuantBlock; ++b) {
    const float* x = src + b * kQuantBlock;
    float amax = 0;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float id = amax != 0 ? 127.0f / amax : 0.0f;
    dst[b].d = amax / 127.0f;
    for (int j = 0; j < kQuantBlock; ++j) {
      dst[b].qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));  // default mode: to even
    }
  }
}

float quantize_activation_row_int8(const float* x, int64_t k, float static_scale, int8_t* q) {
  float scale = static_scale, inv = 0;
  if (static_scale > 0) {
    inv = 1.0f / static_scale;
  } else {
    float amax = 0;
    for (int64_t t = 0; t < k; ++t) amax = std::fmax(amax, std::fabs(x[t]));
    scale = amax / 127.0f;
    inv = amax != 0 ? 127.0f / amax : 0.0f;
  }
  for (int64_t t = 0; t < k; ++t) {
    const float v = std::nearbyint(x[t] * inv);  // default mode: to even
    q[t] = static_cast<int8_t>(v > 127.0f ? 127 : (v < -127.0f ? -127 : v));
  }
  return scale;
}

void quantize_weight_row_symmetric(const float* w, int64_t k, int bits, int64_t group, int8_t* codes, float* scales) {
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  for (int64_t g = 0; g < k / group; ++g) {
    const float* x = w + g * group;
    float amax = 0;
    for (int64_t t = 0; t < group; ++t) amax = std::fmax(amax, std::fabs(x[t]));
    scales[g] = amax / qmax;
    const float inv = amax != 0 ? qmax / amax : 0.0f;
    for (int64_t t = 0; t < group; ++t) {
      const float v = std::nearbyint(x[t] * inv);
      codes[g * group + t] = static_cast<int8_t>(v > qmax ? qmax : (v < -qmax ? -qmax : v));
    }
  }
}

}  // namespace pagoda
