// Micro-benchmark of the matmul kernels on the projection shapes of a 1.1B Llama (hidden 2048,
// intermediate 5632). Reports multiply-adds per second (items_per_second, as GMAC/s x 1e9) and,
// for decode (m = 1), the weight bytes streamed per second, to compare with the machine's memory
// bandwidth (decode cycles through copies of the weights, 64 MiB or more in all, so that they
// stream from memory as a model's do, not from the last-level cache). Not part of ctest: run
// build/.../cpu_kernels_bench by hand.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/testing_context.h"
#include "backend/cpu/scalar/reference_kernels.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "backend/kernels.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace pagoda::cpu {
namespace {

struct Weights {
  std::vector<uint8_t> bytes;
  Tensor w;
  Buffer packed_storage;
  Tensor packed;  // w in the AVX2 matmul's layout
};

Weights random_weights(DType t, int64_t n, int64_t k) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(k));
  const int64_t row_bytes = static_cast<int64_t>(*dtype_bytes(t, static_cast<uint64_t>(k)));
  Weights out;
  out.bytes.resize(static_cast<size_t>(n * row_bytes));
  for (int64_t r = 0; r < n; ++r) {
    for (auto& v : row) v = dist(rng);
    quantize_row(t, row.data(), out.bytes.data() + r * row_bytes, k);
  }
  out.w = Tensor(out.bytes.data(), t, {n, k});
  return out;
}

enum class Kernel { kReference, kAvx2, kAvxVnni, kAvx512, kAvx512Vnni, kAvx512Bf16 };

// Args: dtype, m, n, k, threaded (0: calling thread only; 1: testing_context().pool()); the reference
// kernel runs on the row-major weights, the others on the packed ones.
void run(benchmark::State& state, Kernel kernel) {
  const CpuFeatures& f = cpu_features();
  const bool reference = kernel == Kernel::kReference;
  if (!reference && !f.has_all("avx2 fma f16c")) {
    state.SkipWithError("CPU lacks avx2/fma/f16c");
    return;
  }
  const bool avx512_vnni = kernel == Kernel::kAvx512Vnni || kernel == Kernel::kAvx512Bf16;
  if (kernel == Kernel::kAvxVnni && !f.has("avxvnni")) {
    state.SkipWithError("CPU lacks avxvnni");
    return;
  }
  if ((kernel == Kernel::kAvx512 || avx512_vnni) && !(f.has("avx512f") && f.has("avx512bw"))) {
    state.SkipWithError("CPU lacks avx512f/avx512bw");
    return;
  }
  if (avx512_vnni && !(f.has("avx512vl") && f.has("avx512vnni"))) {
    state.SkipWithError("CPU lacks avx512vl/avx512vnni");
    return;
  }
  if (kernel == Kernel::kAvx512Bf16 && !f.has("avx512bf16")) {
    state.SkipWithError("CPU lacks avx512bf16");
    return;
  }
  auto* packed_matmul = kernel == Kernel::kAvx512Bf16   ? matmul_avx512bf16_pooled
                        : kernel == Kernel::kAvx512Vnni ? matmul_avx512vnni_pooled
                        : kernel == Kernel::kAvx512     ? matmul_avx512_pooled
                        : kernel == Kernel::kAvxVnni    ? matmul_avxvnni_pooled
                                                        : matmul_avx2_pooled;
  const auto t = static_cast<DType>(state.range(0));
  const int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  const bool threaded = state.range(4) != 0;
  std::vector<Weights> copies(1);
  copies[0] = random_weights(t, n, k);
  const int64_t bytes = copies[0].w.nbytes();
  if (m == 1) {
    // Decode reads every weight once per step: cycle through copies that together exceed the
    // caches. PAGODA_BENCH_STREAM_MIB sets the stream (default 64 MiB; a model is 0.5-2 GiB).
    const char* mib = std::getenv("PAGODA_BENCH_STREAM_MIB");
    const int64_t kStreamBytes = (mib != nullptr && std::atoll(mib) > 0 ? std::atoll(mib) : 64) << 20;
    copies.resize(static_cast<size_t>((kStreamBytes + bytes - 1) / bytes));
    for (size_t c = 1; c < copies.size(); ++c) copies[c] = random_weights(t, n, k);
  }
  for (Weights& w : copies) {
    if (!reference) w.packed = pack_matmul_weight_avx2(testing_context(), w.w, &w.packed_storage);
  }
  std::vector<float> x(static_cast<size_t>(m * k), 0.5f), y(static_cast<size_t>(m * n));
  size_t next = 0;
  for (auto _ : state) {
    const Weights& w = copies[next];
    next = (next + 1) % copies.size();
    if (reference) {
      reference_kernels().matmul(testing_context(), x.data(), m, w.w, y.data());
    } else {
      packed_matmul(x.data(), m, w.packed, y.data(), threaded ? &testing_context().pool() : nullptr);
    }
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * m * n * k);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(
      std::string(dtype_name(t)) +
      (threaded ? " threads=" + std::to_string(testing_context().pool().num_threads()) : " 1 thread"));
}

void BM_MatmulAvx2(benchmark::State& state) { run(state, Kernel::kAvx2); }
void BM_MatmulAvxVnni(benchmark::State& state) { run(state, Kernel::kAvxVnni); }
void BM_MatmulAvx512(benchmark::State& state) { run(state, Kernel::kAvx512); }
void BM_MatmulAvx512Vnni(benchmark::State& state) { run(state, Kernel::kAvx512Vnni); }
void BM_MatmulAvx512Bf16(benchmark::State& state) { run(state, Kernel::kAvx512Bf16); }
void BM_MatmulReference(benchmark::State& state) { run(state, Kernel::kReference); }

void avx2_args(benchmark::internal::Benchmark* b) {
  for (const DTypeTraits& traits : all_dtypes()) {
    if (!traits.dense_matmul) continue;
    const DType t = traits.type;
    for (int64_t m : {1, 8, 64, 256}) {
      for (int threaded : {0, 1}) {
        b->Args({static_cast<int64_t>(t), m, 2048, 2048, threaded});
        b->Args({static_cast<int64_t>(t), m, 5632, 2048, threaded});
      }
    }
  }
}

BENCHMARK(BM_MatmulAvx2)
    ->Apply(avx2_args)
    ->ArgNames({"dtype", "m", "n", "k", "threaded"})
    ->UseRealTime();
BENCHMARK(BM_MatmulAvxVnni)
    ->Apply(avx2_args)
    ->ArgNames({"dtype", "m", "n", "k", "threaded"})
    ->UseRealTime();
BENCHMARK(BM_MatmulAvx512)
    ->Apply(avx2_args)
    ->ArgNames({"dtype", "m", "n", "k", "threaded"})
    ->UseRealTime();
BENCHMARK(BM_MatmulAvx512Vnni)
    ->Apply(avx2_args)
    ->ArgNames({"dtype", "m", "n", "k", "threaded"})
    ->UseRealTime();
// The avx512bf16 table differs from avx512vnni only for f16 / bf16 weights.
BENCHMARK(BM_MatmulAvx512Bf16)
    ->Apply([](benchmark::internal::Benchmark* b) {
      for (DType t : {DType::kF16, DType::kBF16}) {
        for (int64_t m : {1, 8, 64, 256}) {
          for (int threaded : {0, 1}) {
            b->Args({static_cast<int64_t>(t), m, 2048, 2048, threaded});
            b->Args({static_cast<int64_t>(t), m, 5632, 2048, threaded});
          }
        }
      }
    })
    ->ArgNames({"dtype", "m", "n", "k", "threaded"})
    ->UseRealTime();
// IntWeight (W8A8 / W4A8; zeros: with zero points, as AWQ / GPTQ checkpoints decode). Args: bits,
// m, n, k, group (0: per channel), threaded, zeros.
// The avx2 and avxvnni tables' matmul_int on the same packed weights.
using MatmulIntPooled = void (*)(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool);

void run_matmul_int(benchmark::State& state, MatmulIntPooled matmul_int) {
  const int bits = static_cast<int>(state.range(0));
  const int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  const int64_t group = state.range(4) > 0 ? state.range(4) : k;
  const bool threaded = state.range(5) != 0, with_zeros = state.range(6) != 0;
  std::mt19937 rng(1);
  std::vector<uint8_t> codes(static_cast<size_t>(n * k * bits / 8));
  for (auto& c : codes) c = static_cast<uint8_t>(rng());
  std::vector<float> scales(static_cast<size_t>(n * (k / group)), 0.01f);
  IntWeight w;
  w.codes = codes.data();
  w.bits = bits;
  w.n = n;
  w.k = k;
  w.group_size = group;
  w.scales = scales.data();
  std::vector<int32_t> zeros(scales.size());
  for (auto& z : zeros) z = static_cast<int32_t>(rng() % 17) - 8;
  if (with_zeros) w.zero_points = zeros.data();
  // Decode streams the weights: enough copies to leave the caches (64 MiB).
  const int64_t bytes = static_cast<int64_t>(codes.size());
  const int64_t copies = m == 1 ? ((int64_t{64} << 20) + bytes - 1) / bytes : 1;
  std::vector<Buffer> storage(static_cast<size_t>(copies));
  std::vector<IntWeight> packed;
  for (auto& s : storage) packed.push_back(pack_int_weight_avx2(testing_context(), w, &s));
  std::vector<float> x(static_cast<size_t>(m * k), 0.5f), y(static_cast<size_t>(m * n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(i % 13) * 0.1f - 0.6f;
  size_t next = 0;
  for (auto _ : state) {
    matmul_int(x.data(), m, packed[next], y.data(), threaded ? &testing_context().pool() : nullptr);
    next = (next + 1) % packed.size();
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * m * n * k);
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(std::string(bits == 8 ? "w8a8" : "w4a8") + (with_zeros ? " zeros" : "") +
                 (threaded ? " threads" : " 1 thread"));
}

void BM_MatmulIntAvx2(benchmark::State& state) {
  const CpuFeatures& f = cpu_features();
  if (!f.has_all("avx2 fma f16c")) {
    state.SkipWithError("CPU lacks avx2/fma/f16c");
    return;
  }
  run_matmul_int(state, matmul_int_avx2_pooled);
}

void BM_MatmulIntAvxVnni(benchmark::State& state) {
  const CpuFeatures& f = cpu_features();
  if (!f.has_all("avx2 fma f16c avxvnni")) {
    state.SkipWithError("CPU lacks avx2/fma/f16c/avxvnni");
    return;
  }
  run_matmul_int(state, matmul_int_avxvnni_pooled);
}

void BM_MatmulIntAvx512Vnni(benchmark::State& state) {
  const CpuFeatures& f = cpu_features();
  if (!f.has_all("avx2 fma f16c avxvnni avx512f avx512bw avx512vnni")) {
    state.SkipWithError("CPU lacks avx2/fma/f16c/avxvnni/avx512f/avx512bw/avx512vnni");
    return;
  }
  run_matmul_int(state, matmul_int_avx512vnni_pooled);
}

void int_args(benchmark::internal::Benchmark* b) {
  for (int bits : {8, 4}) {
    for (int64_t m : {1, 8, 64, 256}) {
      for (int threaded : {0, 1}) {
        for (int zeros : {0, 1}) {
          if (zeros && bits == 8) continue;  // int4 with zero points: AWQ / GPTQ
          b->Args({bits, m, 2048, 2048, bits == 8 ? 0 : 128, threaded, zeros});
          b->Args({bits, m, 5632, 2048, bits == 8 ? 0 : 128, threaded, zeros});
        }
      }
    }
  }
}

BENCHMARK(BM_MatmulIntAvx2)->Apply(int_args)->ArgNames({"bits", "m", "n", "k", "group", "threaded", "zeros"})->UseRealTime();
BENCHMARK(BM_MatmulIntAvxVnni)
    ->Apply(int_args)
    ->ArgNames({"bits", "m", "n", "k", "group", "threaded", "zeros"})
    ->UseRealTime();
BENCHMARK(BM_MatmulIntAvx512Vnni)
    ->Apply(int_args)
    ->ArgNames({"bits", "m", "n", "k", "group", "threaded", "zeros"})
    ->UseRealTime();

// A mixture-of-experts layer's expert products as SparseMoe runs them, at Qwen3-30B-A3B's
// expert shape (768 x 2048; 64 experts here, 8 per token, a fresh routing each iteration, so
// the experts' weights stream from memory as a model's do). Args: dtype, tokens, grouped (1:
// matmul_grouped, every active expert's gate and up as one call and their down as another; 0:
// per active expert a matmul_many of gate and up and a matmul of down, the loop it replaced).
// Bytes: the active experts' weights (each read once per iteration).
void BM_MoeExpertsAvx2(benchmark::State& state) {
  const CpuFeatures& f = cpu_features();
  if (!f.has_all("avx2 fma f16c")) {
    state.SkipWithError("CPU lacks avx2/fma/f16c");
    return;
  }
  constexpr int64_t kExperts = 64, kTopK = 8, kHidden = 2048, kInter = 768, kRoutings = 32;
  const auto t = static_cast<DType>(state.range(0));
  const int64_t tokens = state.range(1), rows = tokens * kTopK;
  const bool grouped = state.range(2) != 0;
  std::vector<Weights> gate(kExperts), up(kExperts), down(kExperts);
  for (int64_t e = 0; e < kExperts; ++e) {
    for (auto [w, n, k] : {std::tuple{&gate[e], kInter, kHidden}, std::tuple{&up[e], kInter, kHidden},
                           std::tuple{&down[e], kHidden, kInter}}) {
      *w = random_weights(t, n, k);
      w->packed = pack_matmul_weight_avx2(testing_context(), w->w, &w->packed_storage);
    }
  }
  // Each routing: tokens x kTopK distinct experts per token, as rows per expert.
  std::mt19937 rng(7);
  std::vector<std::vector<int64_t>> routings(kRoutings);
  for (std::vector<int64_t>& per_expert : routings) {
    per_expert.assign(kExperts, 0);
    for (int64_t i = 0; i < tokens; ++i) {
      std::vector<int64_t> order(kExperts);
      for (int64_t e = 0; e < kExperts; ++e) order[e] = e;
      std::shuffle(order.begin(), order.end(), rng);
      for (int64_t j = 0; j < kTopK; ++j) ++per_expert[order[j]];
    }
  }
  std::vector<float> x(static_cast<size_t>(rows * kHidden), 0.5f), g(static_cast<size_t>(rows * kInter)),
      u(g.size()), out(x.size());
  std::vector<MatmulGroup> groups;
  int64_t bytes = 0;
  size_t next = 0;
  for (auto _ : state) {
    const std::vector<int64_t>& per_expert = routings[next];
    next = (next + 1) % routings.size();
    groups.clear();
    int64_t row = 0;
    for (int64_t e = 0; e < kExperts; ++e) {
      const int64_t m = per_expert[e];
      if (m == 0) continue;
      bytes += gate[e].w.nbytes() + up[e].w.nbytes() + down[e].w.nbytes();
      if (grouped) {
        groups.push_back(MatmulGroup{row, m, &gate[e].packed, g.data() + row * kInter});
        groups.push_back(MatmulGroup{row, m, &up[e].packed, u.data() + row * kInter});
      } else {
        const Tensor* ws[2] = {&gate[e].packed, &up[e].packed};
        float* ys[2] = {g.data() + row * kInter, u.data() + row * kInter};
        matmul_avx2_many(testing_context(), x.data() + row * kHidden, m, ws, ys, 2);
      }
      row += m;
    }
    if (grouped) {
      matmul_avx2_grouped(testing_context(), x.data(), groups.data(), static_cast<int>(groups.size()));
      groups.clear();
    }
    row = 0;
    for (int64_t e = 0; e < kExperts; ++e) {
      const int64_t m = per_expert[e];
      if (m == 0) continue;
      if (grouped) {
        groups.push_back(MatmulGroup{row, m, &down[e].packed, out.data() + row * kHidden});
      } else {
        matmul_avx2(testing_context(), g.data() + row * kInter, m, down[e].packed, out.data() + row * kHidden);
      }
      row += m;
    }
    if (grouped) matmul_avx2_grouped(testing_context(), g.data(), groups.data(), static_cast<int>(groups.size()));
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * rows * 3 * kInter * kHidden);
  state.SetBytesProcessed(bytes);
  state.SetLabel(std::string(dtype_name(t)) + (grouped ? " grouped" : " per expert") +
                 " threads=" + std::to_string(testing_context().pool().num_threads()));
}

BENCHMARK(BM_MoeExpertsAvx2)
    ->ArgsProduct({{static_cast<int64_t>(DType::kQ4_0), static_cast<int64_t>(DType::kQ4_K),
                    static_cast<int64_t>(DType::kBF16)},
                   {1, 16, 128},
                   {0, 1}})
    ->ArgNames({"dtype", "tokens", "grouped"})
    ->UseRealTime();

BENCHMARK(BM_MatmulReference)
    ->Args({static_cast<int64_t>(DType::kBF16), 1, 2048, 2048, 0})
    ->Args({static_cast<int64_t>(DType::kQ4_0), 8, 2048, 2048, 0})
    ->ArgNames({"dtype", "m", "n", "k", "threaded"})
    ->UseRealTime();

}  // namespace
}  // namespace pagoda::cpu

BENCHMARK_MAIN();
