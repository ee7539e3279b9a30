// Peak-rate loops for MachineLimits on AVX-512 machines: f32 FMA, int8 VNNI (vpdpbusd) and bf16
// (vdpbf16ps). This file alone is built with those flags; callers check cpu_features() first.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/x86/peak_loops.h"

namespace pagoda::cpu {

uint64_t fma_loop_avx512(uint64_t iterations, float* sink) {
  __m512 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  for (uint64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 10; ++i) sum = _mm512_add_ps(sum, acc[i]);
  _mm512_storeu_ps(sink, sum);
  return iterations * 10 * 16 * 2;
}

// Each vpdpbusd does 64 u8 x s8 products and their sums into 16 int32 lanes: 128 operations.
uint64_t vnni_loop_avx512(uint64_t iterations, int32_t* sink) {
  __m512i acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi8(3), b = _mm512_set1_epi8(-2);
  for (uint64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  __m512i sum = acc[0];
  for (int i = 1; i < 10; ++i) sum = _mm512_add_epi32(sum, acc[i]);
  _mm512_storeu_si512(sink, sum);
  return iterations * 10 * 64 * 2;
}

// Each vdpbf16ps does 32 bf16 products summed pairwise into 16 f32 lanes: 64 operations.
uint64_t bf16_loop_avx512(uint64_t iterations, float* sink) {
  __m512 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1e-6f), _mm512_set1_ps(2e-6f));
  for (uint64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < 10; ++i) sum = _mm512_add_ps(sum, acc[i]);
  _mm512_storeu_ps(sink, sum);
  return iterations * 10 * 32 * 2;
}

}  // namespace pagoda::cpu
