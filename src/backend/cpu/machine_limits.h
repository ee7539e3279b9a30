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
  double read_gbps = 0;         // GB/s (1e9 bytes), a streaming read of a large buffer (the
                                // architecture's loads where the CPU has them: on x86 AVX2 loads,
                                // four streams per thread; machine_peaks.h)
  double f32_fma_gflops = 0;    // GFLOP/s (an FMA counts 2)
  std::string f32_isa;          // the loop's: "avx512f", "avx2+fma" (x86), or "scalar"
  double int8_dot_gops = 0;     // GOP/s of u8 x s8 multiply-adds (a multiply-add counts 2)
  std::string int8_isa;         // "avx512vnni", "avx2" (vpmaddubsw + vpmaddwd) on x86, or "" (none)
  double bf16_dot_gflops = 0;   // GFLOP/s of bf16 dot products (x86: AVX512_BF16); 0 when absent
};

// `buffer_bytes` for the bandwidth read (well above the caches), `seconds` per arithmetic test.
MachineLimits measure_machine_limits(int threads, int64_t buffer_bytes, double seconds);

// The read bandwidth figure of MachineLimits and what it was computed from: the best of five
// passes, each over all of a `buffer_bytes` buffer split in `threads` disjoint slices.
struct ReadBandwidth {
  double gbps = 0;     // bytes / seconds / 1e9; all 0 when nothing was read (a buffer too
                       // small for one block, or no memory for it)
  int64_t bytes = 0;   // bytes read in the pass (the buffer down to whole blocks of the read
                       // loop: 256 bytes with x86's AVX2, 8-byte words without)
  double seconds = 0;  // the pass's wall time: from a clock read before any thread may start
                       // reading to the last thread's finish
  double slowest_thread_seconds = 0;  // the longest any thread of that pass spent on its slice,
                                      // timed by the thread itself; never above `seconds`
};
ReadBandwidth measure_read_bandwidth(int threads, int64_t buffer_bytes);

// The CPU's model name (from /proc/cpuinfo), or "unknown".
std::string cpu_model_name();

}  // namespace pagoda::cpu
