#include "backends/cpu/machine_limits.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/x86/peak_loops.h"

namespace pagoda::cpu {

namespace {

using Clock = std::chrono::steady_clock;

// Runs work(thread_index) on `threads` threads started together; returns the wall seconds from
// the common start to the last finish.
double run_parallel(int threads, const std::function<void(int)>& work) {
  std::barrier start(threads + 1);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      start.arrive_and_wait();
      work(t);
    });
  }
  start.arrive_and_wait();
  const auto t0 = Clock::now();
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Operations per second of `loop` on every thread, the best of three runs of about `seconds`.
double peak_rate(int threads, double seconds, uint64_t (*loop)(uint64_t, float*)) {
  float sink[16];
  // Calibrate: iterations that take about `seconds` on one thread.
  uint64_t iterations = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    loop(iterations, sink);
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (s > seconds / 8 || iterations > (uint64_t{1} << 40)) {
      iterations = static_cast<uint64_t>(static_cast<double>(iterations) * seconds / std::max(s, 1e-6));
      break;
    }
    iterations *= 4;
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::atomic<uint64_t> ops{0};
    const double s = run_parallel(threads, [&](int) {
      float local[16];
      ops += loop(iterations, local);
    });
    best = std::max(best, static_cast<double>(ops.load()) / s);
  }
  return best;
}

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

// Baseline loop for CPUs without AVX2: the compiler's own code, four chains.
uint64_t fma_loop_scalar(uint64_t iterations, float* sink) {
  float a0 = 0.1f, a1 = 0.2f, a2 = 0.3f, a3 = 0.4f;
  for (uint64_t i = 0; i < iterations; ++i) {
    a0 = a0 * 0.999999f + 1e-7f;
    a1 = a1 * 0.999999f + 1e-7f;
    a2 = a2 * 0.999999f + 1e-7f;
    a3 = a3 * 0.999999f + 1e-7f;
  }
  sink[0] = a0 + a1 + a2 + a3;
  return iterations * 4 * 2;
}

// GB/s of all threads summing disjoint slices of one large buffer, the best of five passes.
double read_bandwidth(int threads, int64_t bytes) {
  const size_t n = static_cast<size_t>(bytes) / sizeof(uint64_t);
  void* mem = mmap(nullptr, n * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return 0;
  auto* data = static_cast<uint64_t*>(mem);
  // Each thread first touches its own slice, so its pages sit near it.
  run_parallel(threads, [&](int t) {
    const size_t lo = n * static_cast<size_t>(t) / static_cast<size_t>(threads);
    const size_t hi = n * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
    for (size_t i = lo; i < hi; ++i) data[i] = i;
  });
  std::atomic<uint64_t> total{0};
  double best = 0;
  const bool avx2 = cpu_features().avx2;
  for (int pass = 0; pass < 5; ++pass) {
    const double s = run_parallel(threads, [&](int t) {
      // Slices of whole 256-byte blocks (mmap memory is page aligned).
      const size_t blocks = n * sizeof(uint64_t) / 256;
      const size_t lo = n * static_cast<size_t>(t) / static_cast<size_t>(threads);
      const size_t hi = n * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
      if (avx2) {  // the wide loads the kernels use
        const size_t b0 = blocks * static_cast<size_t>(t) / static_cast<size_t>(threads);
        const size_t b1 = blocks * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
        total += read_avx2(reinterpret_cast<const char*>(data) + b0 * 256, (b1 - b0) * 256);
        return;
      }
      uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      size_t i = lo;
      for (; i + 4 <= hi; i += 4) {
        s0 += data[i];
        s1 += data[i + 1];
        s2 += data[i + 2];
        s3 += data[i + 3];
      }
      for (; i < hi; ++i) s0 += data[i];
      total += s0 + s1 + s2 + s3;
    });
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / s / 1e9);
  }
  munmap(mem, n * sizeof(uint64_t));
  return total.load() == 0 ? 0 : best;  // (the sum is used, so the reads are not dropped)
}

}  // namespace

MachineLimits measure_machine_limits(int threads, int64_t buffer_bytes, double seconds) {
  MachineLimits m;
  m.threads = std::max(1, threads);
  m.read_gbps = read_bandwidth(m.threads, buffer_bytes);
  const CpuFeatures& f = cpu_features();
  if (f.avx512f) {
    m.f32_isa = "avx512f";
    m.f32_fma_gflops = peak_rate(m.threads, seconds, fma_loop_avx512) / 1e9;
  } else if (f.avx2 && f.fma) {
    m.f32_isa = "avx2+fma";
    m.f32_fma_gflops = peak_rate(m.threads, seconds, fma_loop_avx2) / 1e9;
  } else {
    m.f32_isa = "scalar";
    m.f32_fma_gflops = peak_rate(m.threads, seconds, fma_loop_scalar) / 1e9;
  }
  if (f.avx512vnni) {
    m.int8_isa = "avx512vnni";
    m.int8_dot_gops = peak_rate(m.threads, seconds, vnni_as_float_sink) / 1e9;
  } else if (f.avx2) {
    m.int8_isa = "avx2";
    m.int8_dot_gops = peak_rate(m.threads, seconds, int8_avx2_as_float_sink) / 1e9;
  }
  if (f.avx512bf16) m.bf16_dot_gflops = peak_rate(m.threads, seconds, bf16_loop_avx512) / 1e9;
  return m;
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(' ', colon + 1));
    }
  }
  return "unknown";
}

}  // namespace pagoda::cpu
