// Peak-rate loops for MachineLimits, AVX2 + FMA (this file alone is built with those flags).
// Ten independent accumulator chains hide the FMA latency; the result is stored so the compiler
// cannot drop the work.
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/x86/peak_loops.h"

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

}  // namespace pagoda::cpu
