// Micro-benchmark of the AVX2 element-wise ops on a prefill-sized activation (rows x 5632, the
// FFN width of a 1.1B Llama; RMSNorm on rows x 2048). They are bound by memory traffic:
// bytes_per_second counts every byte read and written once, to compare with `pagoda bench
// roofline`'s bandwidth (for small rows the data sits in cache and can exceed it). Part of
// cpu_kernels_bench, not of ctest.
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/testing_context.h"
#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {
namespace {

bool skip_without_avx2(benchmark::State& state) {
  if (cpu_features().has("avx2") && cpu_features().has("fma")) return false;
  state.SkipWithError("CPU lacks avx2/fma");
  return true;
}

// Arg: rows.
void BM_RmsNormAvx2(benchmark::State& state) {
  if (skip_without_avx2(state)) return;
  const int64_t rows = state.range(0), dim = 2048;
  std::vector<float> x(static_cast<size_t>(rows * dim), 0.5f), w(static_cast<size_t>(dim), 1.1f);
  std::vector<float> y(x.size());
  for (auto _ : state) {
    rms_norm_avx2(testing_context(), x.data(), w.data(), rows, dim, 1e-5f, y.data());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * rows * dim * 4 * 2);  // x read, y written
}

void BM_SiluMulAvx2(benchmark::State& state) {
  if (skip_without_avx2(state)) return;
  const int64_t n = state.range(0) * 5632;
  std::vector<float> gate(static_cast<size_t>(n), 0.3f), up(static_cast<size_t>(n), 0.7f);
  std::vector<float> out(gate.size());
  for (auto _ : state) {
    silu_mul_avx2(testing_context(), gate.data(), up.data(), n, out.data());
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4 * 3);  // gate, up read; out written
}

void BM_AddAvx2(benchmark::State& state) {
  if (skip_without_avx2(state)) return;
  const int64_t n = state.range(0) * 5632;
  std::vector<float> y(static_cast<size_t>(n), 0.3f), x(static_cast<size_t>(n), 1e-7f);
  for (auto _ : state) {
    add_avx2(testing_context(), y.data(), x.data(), n);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * n * 4 * 3);  // y, x read; y written
}

BENCHMARK(BM_RmsNormAvx2)->Arg(1)->Arg(512)->ArgName("rows")->UseRealTime();
BENCHMARK(BM_SiluMulAvx2)->Arg(1)->Arg(512)->ArgName("rows")->UseRealTime();
BENCHMARK(BM_AddAvx2)->Arg(1)->Arg(512)->ArgName("rows")->UseRealTime();

}  // namespace
}  // namespace pagoda::cpu
