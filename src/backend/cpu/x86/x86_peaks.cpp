// The x86-64 loops MachineLimits times (machine_peaks.h), from peak_avx2.cpp and peak_avx512.cpp.
#include <cstring>

#include "backend/cpu/machine_peaks.h"
#include "backend/cpu/x86/peak_loops.h"

namespace pagoda::cpu {

namespace {

uint64_t vnni_as_float_sink(uint64_t iterations, float* sink) {
  int32_t out[16];
  const uint64_t ops = vnni_loop_avx512(iterations, out);
  std::memcpy(sink, out, sizeof out);
  return ops;
}

uint64_t int8_avx2_as_float_sink(uint64_t iterations, float* sink) {
  int32_t out[8];
  const uint64_t ops = int8_dot_loop_avx2(iterations, out);
  std::memcpy(sink, out, sizeof out);
  return ops;
}

constexpr PeakLoop kF32Fma[] = {
    {"avx512f", "avx512f", fma_loop_avx512},
    {"avx2+fma", "avx2 fma", fma_loop_avx2},
};
// avx2: vpmaddubsw + vpmaddwd, the int8 matmul's inner step.
constexpr PeakLoop kInt8Dot[] = {
    {"avx512vnni", "avx512vnni", vnni_as_float_sink},
    {"avx2", "avx2", int8_avx2_as_float_sink},
};
constexpr PeakLoop kBf16Dot[] = {
    {"avx512bf16", "avx512bf16", bf16_loop_avx512},
};
// The wide loads the kernels use, four streams at once, over whole 256-byte blocks.
constexpr ReadLoop kRead[] = {
    {"avx2", 256, read_avx2},
};

}  // namespace

const ArchPeakLoops& arch_peak_loops() {
  static const ArchPeakLoops loops{kF32Fma, kInt8Dot, kBf16Dot, kRead};
  return loops;
}

}  // namespace pagoda::cpu
