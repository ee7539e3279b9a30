// Checks MachineLimits' figures against what the hardware can physically do, and the read
// bandwidth's own bookkeeping: the bytes it counts are the bytes it read, and its clock covers
// every thread's reading (a clock started after the threads may have finished once gave
// 20,000-100,000 GB/s for a 16 MiB buffer). Small buffers and many repetitions: the threads are
// done within microseconds, which is when a late clock shows.
#include "backend/cpu/machine_limits.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>

#include "backend/cpu/cpu_features.h"

namespace pagoda::cpu {
namespace {

// An upper bound on the bytes per second one core can load even from its L1 cache: no x86 core
// loads more than 4 x 64 bytes a cycle (the widest today, with AVX-512, do 2 x 64), and none
// runs above 6.5 GHz (the fastest boost clocks sold are 6.2 GHz). The bandwidth test uses
// 32-byte loads, so a true figure stays well below this even from L1; L2, L3 and DRAM are
// slower still. A late clock gave over ten times this.
constexpr double kMaxCoreGbps = 4 * 64 * 6.5;  // 1,664 GB/s

// The bound for `threads` threads: at most one core each, and no more cores than the machine has.
double max_read_gbps(int threads) {
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return kMaxCoreGbps * std::min(threads, cores);
}

// What the bandwidth pass reads of `buffer` bytes: whole 256-byte blocks with AVX2, whole 8-byte
// words without.
int64_t expected_bytes(int64_t buffer) { return cpu_features().has("avx2") ? buffer / 256 * 256 : buffer / 8 * 8; }

TEST(MachineLimits, ReadBandwidthIsPhysicallyPossibleAndItsClockCoversEveryThread) {
  // One thread, one per core (at most 8, to keep it quick), and twice as many threads as cores
  // (the spawning thread then has to wait for a core, which made a late clock likely).
  const int cores = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  for (int threads : {1, cores, 2 * cores}) {
    for (int64_t buffer : {int64_t{1} << 20, (int64_t{16} << 20) + 100}) {
      for (int rep = 0; rep < 20; ++rep) {
        const ReadBandwidth r = measure_read_bandwidth(threads, buffer);
        const std::string what = std::to_string(threads) + " threads, " + std::to_string(buffer) +
                                 " bytes, repetition " + std::to_string(rep);
        // Bookkeeping, independent of timing noise: the bytes are those of the buffer, the clock
        // covers the longest any thread read (each thread's reading lies between the common start
        // and the last finish), and the figure is the one the two give.
        ASSERT_EQ(r.bytes, expected_bytes(buffer)) << what;
        ASSERT_GT(r.slowest_thread_seconds, 0) << what;
        ASSERT_GE(r.seconds, r.slowest_thread_seconds) << what;
        ASSERT_DOUBLE_EQ(r.gbps, static_cast<double>(r.bytes) / r.seconds / 1e9) << what;
        ASSERT_GT(r.gbps, 0) << what;
        ASSERT_LT(r.gbps, max_read_gbps(threads)) << what << ": " << r.bytes << " bytes in " << r.seconds << " s";
      }
    }
  }
}

TEST(MachineLimits, TooSmallBufferMeasuresNothing) {
  const ReadBandwidth r = measure_read_bandwidth(2, 7);
  EXPECT_EQ(r.gbps, 0);
  EXPECT_EQ(r.bytes, 0);
}

// Every arithmetic rate the CPU has is measured, is positive, and is below what its widest vector
// unit could do: two FMA (or dot-product) ports of 64 bytes a core at 6.5 GHz, each operation on
// the narrowest element counted twice. (Short runs: a figure can only come out low, never high.)
TEST(MachineLimits, MeasuresEveryRateTheCpuHasWithinWhatItsVectorUnitsCanDo) {
  const int threads = 2;
  const MachineLimits m = measure_machine_limits(threads, int64_t{4} << 20, 0.01);
  const CpuFeatures& f = cpu_features();
  const int cores = std::min(threads, std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
  const double per_core_f32 = 2 * 16 * 2 * 6.5, per_core_int8 = 2 * 64 * 2 * 6.5;  // GFLOP/s, GOP/s
  EXPECT_EQ(m.threads, threads);
  EXPECT_GT(m.read_gbps, 0);
  EXPECT_LT(m.read_gbps, max_read_gbps(threads));
  EXPECT_EQ(m.f32_isa, f.has("avx512f") ? "avx512f" : f.has("avx2") && f.has("fma") ? "avx2+fma" : "scalar");
  EXPECT_GT(m.f32_fma_gflops, 0);
  EXPECT_LT(m.f32_fma_gflops, per_core_f32 * cores);
  EXPECT_EQ(m.int8_isa, f.has("avx512vnni") ? "avx512vnni" : f.has("avx2") ? "avx2" : "");
  EXPECT_EQ(m.int8_dot_gops > 0, f.has("avx512vnni") || f.has("avx2"));
  EXPECT_LT(m.int8_dot_gops, per_core_int8 * cores);
  EXPECT_EQ(m.bf16_dot_gflops > 0, f.has("avx512bf16"));
  EXPECT_LT(m.bf16_dot_gflops, per_core_int8 / 2 * cores);  // bf16 pairs: half the int8 lanes
}

}  // namespace
}  // namespace pagoda::cpu
