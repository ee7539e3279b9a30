// The portable part of the CPU backend, built for a CPU without an architecture folder
// (scripts/check-portable-cpu cross-compiles it for aarch64 and runs it under qemu): the features
// are read, no SIMD table is compiled in, "auto" takes the reference kernels, a table name of
// another architecture is refused, the reference matmul on the thread pool computes x W^T (against
// a float64 sum) and the machine limits run their portable loops. Prints what it checked; exits 1
// on the first thing that is wrong.
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/machine_limits.h"

namespace {

int failures = 0;

void expect(bool ok, const std::string& what) {
  std::printf("%s: %s\n", ok ? "ok" : "FAILED", what.c_str());
  if (!ok) ++failures;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace pagoda;
  using namespace pagoda::cpu;
  const std::string want_arch = argc > 1 ? argv[1] : "aarch64";
  const CpuFeatures& f = cpu_features();
  expect(f.arch == want_arch, "architecture " + f.arch + " (features: " + f.to_string() + ")");
  expect(cpu_kernel_tables().empty(), "no SIMD kernel table compiled in");

  auto backend = CpuBackend::create(CpuBackendOptions{.isa = "auto", .threads = 2});
  expect(backend.ok() && (*backend)->description().find("reference kernels") != std::string::npos,
         "auto picks " + (backend.ok() ? (*backend)->description() : backend.status().message()));
  Result<std::string> x86 = parse_cpu_isa("avx2");
  expect(!x86.ok() && x86.status().message().find("auto") != std::string::npos,
         "PAGODA_CPU_ISA=avx2 refused: " + (x86.ok() ? std::string("accepted") : x86.status().message()));
  if (!backend.ok()) return 1;

  // y[m, n] = x[m, k] W[n, k]^T on the pool's two threads.
  const int64_t m = 3, n = 37, k = 70;
  std::vector<float> x(m * k), w(n * k), y(m * n, 0.0f);
  for (int64_t i = 0; i < m * k; ++i) x[i] = std::sin(0.37 * static_cast<double>(i));
  for (int64_t i = 0; i < n * k; ++i) w[i] = std::cos(0.11 * static_cast<double>(i)) * 0.5;
  const Tensor wt(w.data(), DType::kF32, {n, k});
  (*backend)->kernels().matmul(x.data(), m, wt, y.data());
  double worst = 0;
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t c = 0; c < n; ++c) {
      double want = 0;
      for (int64_t i = 0; i < k; ++i) want += static_cast<double>(x[r * k + i]) * w[c * k + i];
      worst = std::max(worst, std::abs(want - y[r * n + c]));
    }
  }
  expect(worst < 1e-4, "reference matmul within 1e-4 of float64 (worst " + std::to_string(worst) + ")");

  const MachineLimits limits = measure_machine_limits(1, int64_t{8} << 20, 0.02);
  expect(limits.read_gbps > 0 && limits.f32_isa == "scalar" && limits.f32_fma_gflops > 0 &&
             limits.int8_isa.empty() && limits.bf16_dot_gflops == 0,
         "machine limits on the portable loops: read " + std::to_string(limits.read_gbps) + " GB/s, f32 " +
             limits.f32_isa + " " + std::to_string(limits.f32_fma_gflops) + " GFLOP/s");
  return failures == 0 ? 0 : 1;
}
