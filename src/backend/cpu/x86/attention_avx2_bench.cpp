// Micro-benchmark of the AVX2 and AVX-512 paged attention on TinyLlama's shape (32 query heads sharing 4 kv
// heads of 64, blocks of 16 tokens). Decode: one query token over a context; its figure to beat
// is the time to read that context's K and V once (bytes_per_second against `pagoda bench
// roofline`'s bandwidth). Prefill: a whole prompt, causal; items_per_second counts the
// multiply-adds of q.k and p.v. Part of cpu_kernels_bench, not of ctest.
#include <benchmark/benchmark.h>

#include <numeric>
#include <random>
#include <vector>

#include "backend/kernels.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kv_rows.h"
#include "backend/cpu/testing_context.h"
#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {
namespace {

constexpr int64_t kHeads = 32, kKvHeads = 4, kHeadDim = 64, kBlock = 16;

using PooledAttention = void (*)(const float*, const AttentionSeq*, int64_t, const KvLayerView&, const AttentionParams&,
                                 float*, float*, ThreadPool*);

// Args: context length, query tokens (1 = decode; = context: a whole prefill), threaded, the
// cache's KvCacheDtype (0 = f32).
void run_paged_attention(benchmark::State& state, PooledAttention attention) {
  const int64_t context = state.range(0), num_query = state.range(1);
  const bool threaded = state.range(2) != 0;
  const auto dtype = static_cast<KvCacheDtype>(state.range(3));
  const int64_t blocks = (context + kBlock - 1) / kBlock;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const auto rows = static_cast<size_t>(blocks * kBlock * kKvHeads);
  std::vector<uint8_t> key(rows * kHeadDim * static_cast<size_t>(kv_cache_elem_bytes(dtype)));
  std::vector<uint8_t> value(key.size());
  std::vector<float> key_scales(rows), value_scales(rows);
  const bool int8 = dtype == KvCacheDtype::kInt8;
  const KvLayerView cache{key.data(),  value.data(), blocks, kBlock, kKvHeads, kHeadDim, dtype,
                          int8 ? key_scales.data() : nullptr, int8 ? value_scales.data() : nullptr};
  std::vector<float> row(kHeadDim);
  for (int64_t slot = 0; slot < blocks * kBlock; ++slot) {
    for (int64_t h = 0; h < kKvHeads; ++h) {
      for (bool is_value : {false, true}) {
        for (auto& v : row) v = dist(rng);
        write_kv_row(cache, is_value, slot, h, row.data());
      }
    }
  }
  std::vector<BlockId> table(static_cast<size_t>(blocks));
  std::iota(table.begin(), table.end(), 0);
  std::vector<float> q(static_cast<size_t>(num_query * kHeads * kHeadDim), 0.1f);
  std::vector<float> out(q.size());
  const AttentionSeq seq{0, num_query, context, table.data()};
  const AttentionParams params{kHeads, kKvHeads, kHeadDim, 0.125f, 0};
  for (auto _ : state) {
    attention(q.data(), &seq, 1, cache, params, out.data(), nullptr, threaded ? &testing_context().pool() : nullptr);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  // Keys each query row reads: all of the context for decode, a triangle for a prefill.
  const int64_t first = context - num_query;
  int64_t keys_read = 0;
  for (int64_t j = 0; j < num_query; ++j) keys_read += first + j + 1;
  state.SetItemsProcessed(state.iterations() * keys_read * kHeads * kHeadDim * 2);
  state.SetBytesProcessed(state.iterations() * context * kKvHeads * kHeadDim * kv_cache_elem_bytes(dtype) * 2);
  state.SetLabel(std::string(kv_cache_dtype_name(dtype)) + ", " +
                 (threaded ? "threads=" + std::to_string(testing_context().pool().num_threads()) : "1 thread"));
}

void BM_PagedAttentionAvx2(benchmark::State& state) {
  if (!(cpu_features().has("avx2") && cpu_features().has("fma"))) {
    state.SkipWithError("CPU lacks avx2/fma");
    return;
  }
  run_paged_attention(state, paged_attention_avx2_pooled);
}

void BM_PagedAttentionAvx512(benchmark::State& state) {
  if (!cpu_features().has_all("avx2 fma avx512f")) {
    state.SkipWithError("CPU lacks avx2/fma/avx512f");
    return;
  }
  run_paged_attention(state, paged_attention_avx512_pooled);
}

#define PAGODA_ATTENTION_BENCH_ARGS                          \
  Args({512, 1, 1, 0})                                       \
      ->Args({4096, 1, 0, 0})                                \
      ->Args({4096, 1, 1, 0})                                \
      ->Args({512, 512, 1, 0})                               \
      ->Args({2048, 2048, 1, 0})                             \
      ->Args({8192, 512, 1, 0})                              \
      ->Args({8192, 512, 1, 3})                              \
      ->Args({8192, 512, 1, 5})                              \
      ->Args({32768, 1, 1, 3})                               \
      ->Args({131072, 1, 1, 0})                              \
      ->Args({1024, 1024, 1, 0})                             \
      ->Args({8192, 8192, 1, 0})                             \
      ->Args({32768, 32768, 1, 0})                           \
      ->Args({32768, 2048, 1, 0})                            \
      ->ArgNames({"context", "query", "threaded", "dtype"}) \
      ->UseRealTime()
BENCHMARK(BM_PagedAttentionAvx2)->PAGODA_ATTENTION_BENCH_ARGS;
BENCHMARK(BM_PagedAttentionAvx512)->PAGODA_ATTENTION_BENCH_ARGS;
#undef PAGODA_ATTENTION_BENCH_ARGS

}  // namespace
}  // namespace pagoda::cpu
