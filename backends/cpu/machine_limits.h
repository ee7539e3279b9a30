// The limits of the machine the engine runs on, measured rather than looked up: the memory read
// bandwidth that decode is bound by, and the peak arithmetic rate of the instruction kinds the
// kernels use (f32 FMA; int8 and bf16 dot products where the CPU has them). `pagoda bench
// roofline` reports them next to what the engine reaches.
//
// Every figure uses `threads` threads at once (one per core is what the engine uses). Each is the
// best of a few short repetitions: a shared machine only ever makes a run slower.
#pragma once

#include <cstdint>
#include <string>

namespace pagoda::cpu {

struct MachineLimits {
  int threads = 0;
  double read_gbps = 0;         // GB/s (1e9 bytes), a streaming read of a large buffer (AVX2
                                // loads, four streams per thread, where the CPU has AVX2)
  double f32_fma_gflops = 0;    // GFLOP/s (an FMA counts 2)
  std::string f32_isa;          // "avx512f", "avx2+fma", or "scalar"
  double int8_dot_gops = 0;     // GOP/s of u8 x s8 multiply-adds (a multiply-add counts 2)
  std::string int8_isa;         // "avx512vnni", "avx2" (vpmaddubsw + vpmaddwd), or "" (none)
  double bf16_dot_gflops = 0;   // GFLOP/s of bf16 dot products (AVX512_BF16); 0 when absent
};

// `buffer_bytes` for the bandwidth read (well above the caches), `seconds` per arithmetic test.
MachineLimits measure_machine_limits(int threads, int64_t buffer_bytes, double seconds);

// The CPU's model name (from /proc/cpuinfo), or "unknown".
std::string cpu_model_name();

}  // namespace pagoda::cpu
