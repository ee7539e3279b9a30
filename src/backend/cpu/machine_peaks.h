// The loops MachineLimits times (machine_limits.h), per architecture: its folder lists the
// peak-rate loops of the instruction kinds its kernels use, and the memory read they stream
// weights with (x86/x86_peaks.cpp; scalar/no_simd_tables.cpp lists none). measure_machine_limits()
// runs, of each kind, the first loop whose features the CPU has, else the portable scalar loop
// (f32 FMA, memory read) or nothing (int8 and bf16 dot products).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace pagoda::cpu {

// A peak-rate loop: `iterations` rounds of independent accumulator chains of one instruction
// kind; returns the operations done (a multiply-add counts 2) and writes up to 16 floats to `sink`
// so the work cannot be dropped.
struct PeakLoop {
  std::string_view isa;    // what MachineLimits reports (f32_isa, int8_isa), e.g. "avx2+fma"
  std::string_view needs;  // the CPU features it needs (CpuFeatures::has_all), e.g. "avx2 fma"
  uint64_t (*loop)(uint64_t iterations, float* sink);
};

// A streaming read: `read` reads `bytes` (whole blocks of `block_bytes`, from a whole number of
// blocks into a page-aligned buffer) and returns their sum, so the loads cannot be dropped.
struct ReadLoop {
  std::string_view needs;  // as PeakLoop::needs
  uint64_t block_bytes;
  uint64_t (*read)(const void* data, uint64_t bytes);
};

// An architecture's loops of each kind, best first.
struct ArchPeakLoops {
  std::span<const PeakLoop> f32_fma;
  std::span<const PeakLoop> int8_dot;
  std::span<const PeakLoop> bf16_dot;
  std::span<const ReadLoop> read;
};

// This build's architecture's loops: defined by its folder (x86/x86_peaks.cpp), or none
// (scalar/no_simd_tables.cpp).
const ArchPeakLoops& arch_peak_loops();

}  // namespace pagoda::cpu
