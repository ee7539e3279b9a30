// Peak-rate loops for MachineLimits, AVX2 + FMA (this file alone is built with those flags).
// Ten independent accumulator chains hide the FMA latency; the result is stored so the compiler
// cannot drop the work.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/x86/peak_loops.h"

namespace pagoda::cpu {

uint64_t fma_loop_avx2(uint64_t iterations, float* sink) {
  __m256 acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i) * 1e-3f);
  const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-7f);
  for (uint64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 10; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < 10; ++i) sum = _mm256_add_ps(sum, acc[i]);
  _mm256_storeu_ps(sink, sum);
  return iterations * 10 * 8 * 2;
}

uint64_t int8_dot_loop_avx2(uint64_t iterations, int32_t* sink) {
  // The int8 matmul's inner step: u8 x s8 pairs summed to int16 (vpmaddubsw), widened to int32
  // (vpmaddwd against ones) and accumulated: 32 multiply-adds.
  __m256i acc[10];
  for (int i = 0; i < 10; ++i) acc[i] = _mm256_set1_epi32(i);
  // The signed operand is the accumulator's own bytes, so no product can be hoisted out of the
  // loop (its values wrap; only the instruction rate matters).
  const __m256i a = _mm256_set1_epi8(3), ones = _mm256_set1_epi16(1);
  for (uint64_t it = 0; it < iterations; ++it) {
    for (int i = 0; i < 10; ++i) {
      acc[i] = _mm256_add_epi32(acc[i], _mm256_madd_epi16(_mm256_maddubs_epi16(a, acc[i]), ones));
    }
  }
  __m256i sum = acc[0];
  for (int i = 1; i < 10; ++i) sum = _mm256_add_epi32(sum, acc[i]);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(sink), sum);
  return iterations * 10 * 32 * 2;
}

uint64_t read_avx2(const void* data, uint64_t bytes) {
  // Four sequential streams at once (quarters of the range), as a matmul reads several weight
  // rows together: one stream alone leaves the memory system idle between prefetches.
  const uint64_t quarter = bytes / 4 / 64 * 64;
  const auto* base = static_cast<const char*>(data);
  const __m256i* s[4];
  for (int k = 0; k < 4; ++k) s[k] = reinterpret_cast<const __m256i*>(base + quarter * static_cast<uint64_t>(k));
  __m256i acc[8];
  for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_si256();
  for (uint64_t i = 0; i < quarter / 32; i += 2) {
    for (int k = 0; k < 4; ++k) {
      acc[2 * k] = _mm256_add_epi64(acc[2 * k], _mm256_load_si256(s[k] + i));
      acc[2 * k + 1] = _mm256_add_epi64(acc[2 * k + 1], _mm256_load_si256(s[k] + i + 1));
    }
  }
  for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_epi64(acc[0], acc[j]);
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

}  // namespace pagoda::cpu
