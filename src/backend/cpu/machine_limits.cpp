#include "backend/cpu/machine_limits.h"

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <span>
#include <thread>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/machine_peaks.h"

namespace pagoda::cpu {

namespace {

using Clock = std::chrono::steady_clock;

struct ParallelTiming {
  double seconds = 0;                 // from before any thread began its work to the last end
  double slowest_thread_seconds = 0;  // the longest one thread's own start-to-end time
};

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Runs work(thread_index) on `threads` threads started together. The last thread to arrive
// reads the clock and then lets all of them go, so no work can precede the start; the others
// spin (yielding) rather than sleep, so none is late by a wake-up (in a VM a sleeping thread took
// as long to wake as a 16 MiB read takes). Each thread reads the clock when its own work ends,
// so the span ends at the last finish however late the spawning thread gets to join them. (A
// clock read by the spawning thread after the start came too late when it lost its core
// meanwhile: the workers could be done by then, and a 16 MiB read timed as 30,000 GB/s.)
ParallelTiming run_parallel(int threads, const std::function<void(int)>& work) {
  std::atomic<int> arrived{0};
  std::atomic<bool> go{false};
  Clock::time_point start_time;
  std::vector<Clock::time_point> began(static_cast<size_t>(threads)), ended(static_cast<size_t>(threads));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      if (arrived.fetch_add(1) + 1 == threads) {
        start_time = Clock::now();
        go.store(true, std::memory_order_release);
      } else {
        while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
      }
      began[static_cast<size_t>(t)] = Clock::now();
      work(t);
      ended[static_cast<size_t>(t)] = Clock::now();
    });
  }
  for (auto& th : pool) th.join();  // (the join also makes every clock reading visible here)
  ParallelTiming timing;
  for (size_t t = 0; t < began.size(); ++t) {
    timing.seconds = std::max(timing.seconds, seconds_between(start_time, ended[t]));
    timing.slowest_thread_seconds = std::max(timing.slowest_thread_seconds, seconds_between(began[t], ended[t]));
  }
  return timing;
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
    const ParallelTiming timing = run_parallel(threads, [&](int) {
      float local[16];
      ops += loop(iterations, local);
    });
    best = std::max(best, static_cast<double>(ops.load()) / timing.seconds);
  }
  return best;
}

// The portable loops, for CPUs without the architecture's (machine_peaks.h): the compiler's own
// code, four chains.
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

uint64_t read_words(const void* data, uint64_t bytes) {
  const auto* words = static_cast<const uint64_t*>(data);
  const uint64_t n = bytes / sizeof(uint64_t);
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  uint64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    s0 += words[i];
    s1 += words[i + 1];
    s2 += words[i + 2];
    s3 += words[i + 3];
  }
  for (; i < n; ++i) s0 += words[i];
  return s0 + s1 + s2 + s3;
}

constexpr PeakLoop kScalarFma = {"scalar", "", fma_loop_scalar};
constexpr ReadLoop kReadWords = {"", sizeof(uint64_t), read_words};

// The first of `loops` the CPU has, or `fallback`.
template <typename Loop>
const Loop* first_supported(std::span<const Loop> loops, const Loop* fallback) {
  for (const Loop& loop : loops) {
    if (cpu_features().has_all(loop.needs)) return &loop;
  }
  return fallback;
}

}  // namespace

ReadBandwidth measure_read_bandwidth(int threads, int64_t buffer_bytes) {
  threads = std::max(1, threads);
  const size_t n = static_cast<size_t>(std::max<int64_t>(buffer_bytes, 0)) / sizeof(uint64_t);
  if (n == 0) return {};
  void* mem = mmap(nullptr, n * sizeof(uint64_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) return {};
  auto* data = static_cast<uint64_t*>(mem);
  // Each thread first touches its own slice, so its pages sit near it.
  run_parallel(threads, [&](int t) {
    const size_t lo = n * static_cast<size_t>(t) / static_cast<size_t>(threads);
    const size_t hi = n * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
    for (size_t i = lo; i < hi; ++i) data[i] = i;
  });
  std::atomic<uint64_t> total{0};
  ReadBandwidth best;
  // The architecture's read, the loads the kernels use, over slices of whole blocks (mmap memory
  // is page aligned); else 8-byte words.
  const ReadLoop& read = *first_supported(arch_peak_loops().read, &kReadWords);
  const size_t blocks = n * sizeof(uint64_t) / read.block_bytes;
  for (int pass = 0; pass < 5; ++pass) {
    std::atomic<uint64_t> bytes_read{0};
    const ParallelTiming timing = run_parallel(threads, [&](int t) {
      const size_t b0 = blocks * static_cast<size_t>(t) / static_cast<size_t>(threads);
      const size_t b1 = blocks * static_cast<size_t>(t + 1) / static_cast<size_t>(threads);
      total += read.read(reinterpret_cast<const char*>(data) + b0 * read.block_bytes, (b1 - b0) * read.block_bytes);
      bytes_read += (b1 - b0) * read.block_bytes;
    });
    const double gbps = timing.seconds > 0 ? static_cast<double>(bytes_read.load()) / timing.seconds / 1e9 : 0;
    if (pass == 0 || gbps > best.gbps) {
      best = {gbps, static_cast<int64_t>(bytes_read.load()), timing.seconds, timing.slowest_thread_seconds};
    }
  }
  munmap(mem, n * sizeof(uint64_t));
  if (total.load() == 0) return {};  // (the sum is used, so the reads are not dropped)
  return best;
}

MachineLimits measure_machine_limits(int threads, int64_t buffer_bytes, double seconds) {
  MachineLimits m;
  m.threads = std::max(1, threads);
  m.read_gbps = measure_read_bandwidth(m.threads, buffer_bytes).gbps;
  const ArchPeakLoops& loops = arch_peak_loops();
  const PeakLoop* f32 = first_supported(loops.f32_fma, &kScalarFma);
  m.f32_isa = f32->isa;
  m.f32_fma_gflops = peak_rate(m.threads, seconds, f32->loop) / 1e9;
  if (const PeakLoop* int8 = first_supported<PeakLoop>(loops.int8_dot, nullptr)) {
    m.int8_isa = int8->isa;
    m.int8_dot_gops = peak_rate(m.threads, seconds, int8->loop) / 1e9;
  }
  if (const PeakLoop* bf16 = first_supported<PeakLoop>(loops.bf16_dot, nullptr)) {
    m.bf16_dot_gflops = peak_rate(m.threads, seconds, bf16->loop) / 1e9;
  }
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
