// Peak-rate loops for MachineLimits (x86_peaks.cpp lists them for it): each runs `iterations`
// rounds of ten independent accumulator chains of one instruction kind and returns the operations
// done (an FMA or multiply-add counts 2). The result goes to `sink` so the work cannot be
// optimized away. peak_avx2.cpp and peak_avx512.cpp are the only files built with those flags,
// and this header has nothing inline, so no SIMD code leaks into baseline code. Call only where
// cpu_features() has the instructions (else SIGILL).
#pragma once

#include <cstdint>

namespace pagoda::cpu {

uint64_t fma_loop_avx2(uint64_t iterations, float* sink);     // AVX2 + FMA: sink[8]
uint64_t fma_loop_avx512(uint64_t iterations, float* sink);   // AVX-512F: sink[16]
uint64_t vnni_loop_avx512(uint64_t iterations, int32_t* sink);  // AVX512_VNNI: sink[16]
uint64_t int8_dot_loop_avx2(uint64_t iterations, int32_t* sink);  // AVX2 vpmaddubsw: sink[8]
uint64_t bf16_loop_avx512(uint64_t iterations, float* sink);  // AVX512_BF16: sink[16]

// Reads `bytes` (a multiple of 256, 32-byte aligned) from `data` with AVX2 loads, as four
// sequential streams at once; returns the sum so the loads cannot be dropped.
uint64_t read_avx2(const void* data, uint64_t bytes);

}  // namespace pagoda::cpu
