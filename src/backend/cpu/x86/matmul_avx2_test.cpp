// Checks the AVX2 matmul (on weights packed by pack_matmul_weight_avx2) against the reference
// matmul on random shapes: every weight type, input row counts around the register tiles (1, 4,
// 6), row lengths with odd tails, output row counts around the 8-row panels and the 4-panel
// chunks of the threaded split, k slices (batched inputs); the int8 path bit for bit; that a
// row's result does not depend on the batch; and the activation quantization of the int8 path.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/scalar/reference_kernels.h"
#include "backend/cpu/kernel_table_test_support.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/thread_pool.h"
#include "tensor/convert.h"
#include "tensor/gguf_blocks.h"
#include "tensor/quant_blocks.h"
#include "tensor/tensor.h"

namespace pagoda::cpu {
namespace {

bool has_avx2() {
  const CpuFeatures& f = cpu_features();
  return f.has_all("avx2 fma f16c");
}

std::vector<DType> all_types() {
  std::vector<DType> out;
  for (const DTypeTraits& t : all_dtypes()) {
    if (t.dense_matmul) out.push_back(t.type);
  }
  return out;
}
const std::vector<DType> kAllTypes = all_types();

// Whether a row of k elements is a whole number of t's blocks.
bool fits(DType t, int64_t k) { return k % block_elems(t) == 0; }

// A random [n, k] weight matrix of type t (row-major, and packed for the AVX2 matmul), and
// x: [m, k] f32.
struct Problem {
  std::vector<uint8_t> w_bytes;
  Tensor w;
  Buffer packed_storage;
  Tensor packed;
  std::vector<float> x;
};

using PackFn = Tensor (*)(const ExecContext& ctx, const Tensor& w, Buffer* storage);

Problem make_problem(DType t, int64_t m, int64_t k, int64_t n, uint32_t seed, PackFn pack = pack_matmul_weight_avx2) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  Problem p;
  std::vector<float> wf(static_cast<size_t>(n * k));
  for (auto& v : wf) v = dist(rng);
  const int64_t row_bytes = static_cast<int64_t>(*dtype_bytes(t, static_cast<uint64_t>(k)));
  p.w_bytes.resize(static_cast<size_t>(n * row_bytes));
  for (int64_t r = 0; r < n; ++r)
    quantize_row(t, wf.data() + r * k, p.w_bytes.data() + r * row_bytes, k);
  p.w = Tensor(p.w_bytes.data(), t, {n, k});
  p.packed = pack(kernel_table_testing::test_context(), p.w, &p.packed_storage);
  p.x.resize(static_cast<size_t>(m * k));
  for (auto& v : p.x) v = dist(rng);
  return p;
}

// Expects y to equal the reference matmul: bit for bit for q8_0 / q4_0 (the same integer dots,
// scaled and summed in the same order), within f32 reassociation error for the others (1e-5 of
// the sum of |x * w| over the row), or for f16 / bf16 weights within half_tol of it (the
// avx512bf16 table rounds the inputs, and f16 weights, to bf16).
void expect_matches_reference(const Problem& p, int64_t m, const std::vector<float>& y,
                              const std::string& what, double half_tol = 1e-5) {
  const int64_t n = p.w.num_rows(), k = p.w.row_len();
  std::vector<float> want(static_cast<size_t>(m * n));
  reference_kernels().matmul(kernel_table_testing::test_context(), p.x.data(), m, p.w, want.data());
  std::vector<float> row(static_cast<size_t>(k));
  int failures = 0;
  for (int64_t j = 0; j < n && failures < 5; ++j) {
    dequantize_row(p.w.dtype, p.w.row(j), row.data(), k);
    for (int64_t i = 0; i < m; ++i) {
      double mag = 0;
      for (int64_t t = 0; t < k; ++t)
        mag += std::fabs(static_cast<double>(p.x[i * k + t]) * row[t]);
      const float got = y[i * n + j], ref = want[i * n + j];
      const bool half = p.w.dtype == DType::kF16 || p.w.dtype == DType::kBF16;
      const double tol = half ? half_tol : 1e-5;
      const bool ok = is_quantized(p.w.dtype) ? got == ref : std::fabs(got - ref) <= tol * mag + 1e-30;
      if (!ok) {
        ADD_FAILURE() << what << " y[" << i << ", " << j << "] = " << got << ", reference " << ref
                      << ", sum |x*w| " << mag;
        ++failures;
      }
    }
  }
}

std::string describe(DType t, int64_t m, int64_t k, int64_t n) {
  return std::string(dtype_name(t)) + " m=" + std::to_string(m) + " k=" + std::to_string(k) +
         " n=" + std::to_string(n);
}

// A table's Kernels::matmul: on a given pool, and on the shared one; half_tol: its tolerance for
// f16 / bf16 weights (expect_matches_reference).
struct MatmulEntry {
  void (*pooled)(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool);
  void (*shared)(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y);
  void (*many)(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count);
  void (*grouped)(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count);
  double half_tol = 1e-5;
  PackFn pack = pack_matmul_weight_avx2;  // the table's Kernels::pack_matmul_weight
};
constexpr MatmulEntry kAvx2Matmul{matmul_avx2_pooled, matmul_avx2, matmul_avx2_many, matmul_avx2_grouped};
constexpr MatmulEntry kAvxVnniMatmul{matmul_avxvnni_pooled, matmul_avxvnni, matmul_avxvnni_many,
                                     matmul_avxvnni_grouped};
constexpr MatmulEntry kAvx512VnniMatmul{matmul_avx512vnni_pooled, matmul_avx512vnni, matmul_avx512vnni_many,
                                        matmul_avx512vnni_grouped};
constexpr MatmulEntry kAvx512Matmul{matmul_avx512_pooled, matmul_avx512, matmul_avx512_many, matmul_avx512_grouped};
// Each product of bf16-rounded factors is within 2^-8 (and a little) of the exact one; the f32
// sums add about k 2^-24 of sum |x w|.
constexpr MatmulEntry kAvx512Bf16Matmul{matmul_avx512bf16_pooled, matmul_avx512bf16, matmul_avx512bf16_many,
                                        matmul_avx512bf16_grouped, 0x1p-7, pack_matmul_weight_avx512bf16};

void check_small_shapes(const MatmulEntry& matmul) {
  uint32_t seed = 1;
  for (DType t : kAllTypes) {
    for (int64_t k : {1, 7, 32, 64, 96, 100, 257, 256, 512}) {
      if (!fits(t, k)) continue;
      for (int64_t m : {1, 2, 3, 4, 5, 6, 7, 13, 33}) {
        for (int64_t n : {1, 7, 8, 33, 64, 67}) {
          Problem p = make_problem(t, m, k, n, seed++, matmul.pack);
          std::vector<float> y(static_cast<size_t>(m * n), NAN);
          matmul.pooled(p.x.data(), m, p.packed, y.data(), nullptr);
          expect_matches_reference(p, m, y, describe(t, m, k, n), matmul.half_tol);
        }
      }
    }
  }
}

void check_long_rows_threaded(const MatmulEntry& matmul) {
  ThreadPool pool(3);
  uint32_t seed = 1000;
  for (DType t : kAllTypes) {
    for (int64_t k : {1088, 1280, 2051}) {
      if (!fits(t, k)) continue;
      for (int64_t m : {1, 6, 9}) {
        for (int64_t n : {37, 131, 4097}) {
          if (n == 4097 && m != 1) continue;  // the reference takes long enough
          Problem p = make_problem(t, m, k, n, seed++, matmul.pack);
          std::vector<float> y(static_cast<size_t>(m * n), NAN);
          matmul.pooled(p.x.data(), m, p.packed, y.data(), &pool);
          expect_matches_reference(p, m, y, describe(t, m, k, n) + " pool(3)", matmul.half_tol);
          std::vector<float> y2(static_cast<size_t>(m * n), NAN);
          matmul.shared(kernel_table_testing::test_context(), p.x.data(), m, p.packed, y2.data());
          expect_matches_reference(p, m, y2, describe(t, m, k, n) + " shared pool", matmul.half_tol);
        }
      }
    }
  }
}

void check_thread_count_invariant(const MatmulEntry& matmul) {
  Problem p = make_problem(DType::kQ4_0, 5, 512, 300, 7, matmul.pack);
  std::vector<float> one(5 * 300), many(5 * 300);
  matmul.pooled(p.x.data(), 5, p.packed, one.data(), nullptr);
  ThreadPool pool(4);
  matmul.pooled(p.x.data(), 5, p.packed, many.data(), &pool);
  EXPECT_EQ(one, many);  // each output is computed by one thread in the same order
}

void check_batch_invariant(const MatmulEntry& matmul) {
  ThreadPool pool(3);
  for (DType t : kAllTypes) {
    // k: 4 slices of 256 (2 of 16 blocks) and a part; 1280 (5 super-blocks) for the K-quants.
    const int64_t m = 37, k = fits(t, 1120) ? 1120 : 1280, n = 70;
    Problem p = make_problem(t, m, k, n, 77, matmul.pack);
    std::vector<float> alone(static_cast<size_t>(m * n));
    for (int64_t i = 0; i < m; ++i)
      matmul.pooled(p.x.data() + i * k, 1, p.packed, alone.data() + i * n, nullptr);
    for (int64_t batch : {3, 5, 6, 37}) {
      std::vector<float> batched(static_cast<size_t>(m * n));
      for (int64_t i = 0; i < m; i += batch) {
        const int64_t rows = std::min(batch, m - i);
        matmul.pooled(p.x.data() + i * k, rows, p.packed, batched.data() + i * n, &pool);
      }
      EXPECT_EQ(alone, batched) << dtype_name(t) << " batches of " << batch;
    }
  }
}

// matmul_many: three weights of one type (output counts that end in a partial panel and a
// partial chunk, so the split's chunks cross from one weight to the next), decode and batched,
// small (one thread) and large enough for the shared pool: each output the bits of one matmul.
void check_many_matches_one_at_a_time(const MatmulEntry& matmul) {
  uint32_t seed = 500;
  for (DType t : kAllTypes) {
    const int64_t k = fits(t, 1120) ? 1120 : 1280;
    for (int64_t m : {1, 2, 7}) {
      for (int64_t scale : {1, 8}) {
        const int64_t ns[3] = {37 * scale, 8 * scale + 3, 64 * scale};
        Problem p[3] = {make_problem(t, m, k, ns[0], seed, matmul.pack), make_problem(t, m, k, ns[1], seed + 1, matmul.pack),
                        make_problem(t, m, k, ns[2], seed + 2, matmul.pack)};
        seed += 3;
        const std::vector<float>& x = p[0].x;
        std::vector<float> want[3], got[3];
        const Tensor* ws[3];
        float* ys[3];
        for (int i = 0; i < 3; ++i) {
          want[i].assign(static_cast<size_t>(m * ns[i]), NAN);
          got[i].assign(static_cast<size_t>(m * ns[i]), NAN);
          matmul.shared(kernel_table_testing::test_context(), x.data(), m, p[i].packed, want[i].data());
          ws[i] = &p[i].packed;
          ys[i] = got[i].data();
        }
        matmul.many(kernel_table_testing::test_context(), x.data(), m, ws, ys, 3);
        for (int i = 0; i < 3; ++i) {
          EXPECT_EQ(0, std::memcmp(want[i].data(), got[i].data(), want[i].size() * sizeof(float)))
              << describe(t, m, k, ns[i]) << ": weight " << i << " of 3";
        }
        matmul.many(kernel_table_testing::test_context(), x.data(), m, ws, ys, 1);  // one weight: matmul itself
        EXPECT_EQ(0, std::memcmp(want[0].data(), got[0].data(), want[0].size() * sizeof(float)))
            << describe(t, m, k, ns[0]) << " alone";
      }
    }
  }
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx2, ManyIsEachMatmulBitForBit, "avx2", "matmul_many") {
  check_many_matches_one_at_a_time(kAvx2Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvxVnni, ManyIsEachMatmulBitForBit, "avxvnni", "matmul_many") {
  check_many_matches_one_at_a_time(kAvxVnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Vnni, ManyIsEachMatmulBitForBit, "avx512vnni", "matmul_many") {
  check_many_matches_one_at_a_time(kAvx512VnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512, ManyIsEachMatmulBitForBit, "avx512", "matmul_many") {
  check_many_matches_one_at_a_time(kAvx512Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Bf16, ManyIsEachMatmulBitForBit, "avx512bf16", "matmul_many") {
  check_many_matches_one_at_a_time(kAvx512Bf16Matmul);
}

// matmul_grouped as a mixture of experts calls it: expert e's gate and up over its tokens' rows
// [row_e, row_e + m_e) of one input (rows of one row, of none, of many: every leaf, the batched
// ones and decode's), then, small and large enough for the shared pool. Each group's output is
// the bits of one matmul over its rows alone, and a group of no rows writes nothing.
void check_grouped_matches_each_matmul(const MatmulEntry& matmul) {
  uint32_t seed = 900;
  for (DType t : kAllTypes) {
    const int64_t k = fits(t, 1120) ? 1120 : 1280;
    for (int64_t scale : {1, 6}) {
      const int64_t ms[] = {1, 0, 3, 1, 9, 2};  // tokens per expert
      constexpr int kExperts = std::size(ms);
      int64_t rows = 0;
      for (int64_t m : ms) rows += m;
      std::vector<float> x(static_cast<size_t>(rows * k));
      std::mt19937 rng(seed);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      for (float& v : x) v = dist(rng);
      std::vector<Problem> weights;
      std::vector<MatmulGroup> groups;
      std::vector<std::vector<float>> want, got;
      weights.reserve(2 * kExperts);
      int64_t row = 0;
      for (int e = 0; e < kExperts; ++e) {
        for (int64_t n : {13 * scale + 3, 8 * scale}) {  // gate and up: a partial panel, whole ones
          weights.push_back(make_problem(t, 1, k, n, ++seed, matmul.pack));
          want.emplace_back(static_cast<size_t>(std::max<int64_t>(ms[e], 1) * n), NAN);
          got.emplace_back(want.back().size(), NAN);
          if (ms[e] > 0) matmul.shared(kernel_table_testing::test_context(), x.data() + row * k, ms[e], weights.back().packed, want.back().data());
          groups.push_back(MatmulGroup{row, ms[e], &weights.back().packed, got.back().data()});
        }
        row += ms[e];
      }
      matmul.grouped(kernel_table_testing::test_context(), x.data(), groups.data(), static_cast<int>(groups.size()));
      for (size_t g = 0; g < groups.size(); ++g) {
        const std::string what = describe(t, groups[g].m, k, weights[g].packed.num_rows()) + ", group " +
                                 std::to_string(g) + " of " + std::to_string(groups.size());
        if (groups[g].m == 0) {
          EXPECT_TRUE(std::isnan(got[g][0])) << what << ": an empty group wrote";
        } else {
          EXPECT_EQ(0, std::memcmp(want[g].data(), got[g].data(), want[g].size() * sizeof(float))) << what;
        }
      }
    }
  }
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx2, GroupedIsEachMatmulBitForBit, "avx2", "matmul_grouped") {
  check_grouped_matches_each_matmul(kAvx2Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvxVnni, GroupedIsEachMatmulBitForBit, "avxvnni", "matmul_grouped") {
  check_grouped_matches_each_matmul(kAvxVnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Vnni, GroupedIsEachMatmulBitForBit, "avx512vnni", "matmul_grouped") {
  check_grouped_matches_each_matmul(kAvx512VnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512, GroupedIsEachMatmulBitForBit, "avx512", "matmul_grouped") {
  check_grouped_matches_each_matmul(kAvx512Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Bf16, GroupedIsEachMatmulBitForBit, "avx512bf16", "matmul_grouped") {
  check_grouped_matches_each_matmul(kAvx512Bf16Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx2, MatchesReferenceOnSmallShapes, "avx2", "matmul pack_matmul_weight") {
  check_small_shapes(kAvx2Matmul);
}

// Long rows: batched inputs take the k-sliced path (slices of 256 elements or 16 blocks plus a
// tail), decode the one-pass path; both through a 3-thread pool and through the backend's shared
// pool, over output counts that leave a partial panel and a partial chunk.
PAGODA_KERNEL_TABLE_TEST(MatmulAvx2, MatchesReferenceOnLongRowsThreaded, "avx2", "matmul pack_matmul_weight") {
  check_long_rows_threaded(kAvx2Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx2, ThreadCountDoesNotChangeResults, "avx2", "matmul") {
  check_thread_count_invariant(kAvx2Matmul);
}

// Each input row alone (m = 1) and the same rows in batches of 3, 5, 6 and 37 (other tile
// shapes, the k-sliced path) and on 3 threads: the same bits, for every weight type.
PAGODA_KERNEL_TABLE_TEST(MatmulAvx2, BatchSizeDoesNotChangeResults, "avx2", "matmul") {
  check_batch_invariant(kAvx2Matmul);
}

// The avxvnni table's matmul (every block type on vpdpbusd, the float types the AVX2 leaves):
// the same checks, over every type.
PAGODA_KERNEL_TABLE_TEST(MatmulAvxVnni, MatchesReferenceOnSmallShapes, "avxvnni", "matmul") {
  check_small_shapes(kAvxVnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvxVnni, MatchesReferenceOnLongRowsThreaded, "avxvnni", "matmul") {
  check_long_rows_threaded(kAvxVnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvxVnni, ThreadCountDoesNotChangeResults, "avxvnni", "matmul") {
  check_thread_count_invariant(kAvxVnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvxVnni, BatchSizeDoesNotChangeResults, "avxvnni", "matmul") {
  check_batch_invariant(kAvxVnniMatmul);
}

// The avx512vnni table's matmul (batched q8_0 / q4_x / q5_x on 512-bit vpdpbusd, two panels per
// vector; batched f32 / f16 / bf16 on 512-bit FMAs, four panels per converted slice; the rest the
// avx512vl leaves, the avxvnni ones rebuilt on EVEX vpdpbusd): the same checks, over every type. The shapes' odd panel counts (n = 7, 33, 67)
// take the repeated-half tail and groups of one to four panels, m = 13 and 33 tiles of 8 or 12
// rows and a remainder, k = 257 and 512 several k slices. BatchSizeDoesNotChangeResults holds the
// batched float leaf to the decode (avx2) leaf's bits.
PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Vnni, MatchesReferenceOnSmallShapes, "avx512vnni", "matmul") {
  check_small_shapes(kAvx512VnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Vnni, MatchesReferenceOnLongRowsThreaded, "avx512vnni", "matmul") {
  check_long_rows_threaded(kAvx512VnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Vnni, ThreadCountDoesNotChangeResults, "avx512vnni", "matmul") {
  check_thread_count_invariant(kAvx512VnniMatmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Vnni, BatchSizeDoesNotChangeResults, "avx512vnni", "matmul") {
  check_batch_invariant(kAvx512VnniMatmul);
}

// The avx512 table's matmul (AVX-512 F and BW without VNNI): the batched float products on
// 512-bit FMAs, everything else the AVX2 leaves: the same checks.
PAGODA_KERNEL_TABLE_TEST(MatmulAvx512, MatchesReferenceOnSmallShapes, "avx512", "matmul") {
  check_small_shapes(kAvx512Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512, MatchesReferenceOnLongRowsThreaded, "avx512", "matmul") {
  check_long_rows_threaded(kAvx512Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512, ThreadCountDoesNotChangeResults, "avx512", "matmul") {
  check_thread_count_invariant(kAvx512Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512, BatchSizeDoesNotChangeResults, "avx512", "matmul") {
  check_batch_invariant(kAvx512Matmul);
}

// vdpbf16ps as the avx512bf16 leaf uses it (matmul_bf16_avx512.cpp): both factors rounded to
// bf16 (nearest even; the test's values are never denormal), each product exact in f32, and per
// column pair u: acc = (acc + odd product) + even product.
uint16_t to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(u >> 16);
}
float from_bf16(uint16_t h) {
  const uint32_t u = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

void check_bf16_model(const MatmulEntry& matmul) {
  ThreadPool pool(3);
  uint32_t seed = 5000;
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (int64_t k : {1, 2, 7, 32, 129, 257, 300, 1101}) {
      for (int64_t m : {1, 2, 4, 5, 9, 13, 16, 17, 33}) {
        for (int64_t n : {1, 7, 8, 17, 33, 67}) {
          Problem p = make_problem(t, m, k, n, seed++, matmul.pack);
          std::vector<float> y(static_cast<size_t>(m * n), NAN);
          matmul.pooled(p.x.data(), m, p.packed, y.data(), m == 13 ? &pool : nullptr);
          std::vector<float> row(static_cast<size_t>(k));
          for (int64_t j = 0; j < n; ++j) {
            dequantize_row(t, p.w.row(j), row.data(), k);
            for (int64_t i = 0; i < m; ++i) {
              auto term = [&](int64_t c) {
                if (c >= k) return 0.0f;
                return from_bf16(to_bf16(p.x[i * k + c])) * from_bf16(to_bf16(row[c]));
              };
              float acc = 0;
              for (int64_t u = 0; 2 * u < k; ++u) {
                acc += term(2 * u + 1);
                acc += term(2 * u);
              }
              const float got = y[i * n + j];
              ASSERT_EQ(std::memcmp(&got, &acc, 4), 0) << describe(t, m, k, n) << " y[" << i << ", " << j << "] = " << got
                                                       << ", the bf16 model " << acc;
            }
          }
        }
      }
    }
  }
}

// The avx512bf16 table: f16 / bf16 weights on vdpbf16ps bit for bit as modelled above (the
// direct path up to 16 rows in tiles of up to 8, and the buffered one above, slices of 256
// pairs with a tail at k = 1101, k of every residue mod 4, groups of 1 to 4 panels, on 1 and 3
// threads), within 2^-7 of sum |x w| of the reference in the general checks; every other type
// as the avx512vnni table.
PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Bf16, MatchesBf16ModelBitForBit, "avx512bf16", "matmul pack_matmul_weight") {
  check_bf16_model(kAvx512Bf16Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Bf16, MatchesReferenceOnSmallShapes, "avx512bf16", "matmul pack_matmul_weight") {
  check_small_shapes(kAvx512Bf16Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Bf16, MatchesReferenceOnLongRowsThreaded, "avx512bf16", "matmul") {
  check_long_rows_threaded(kAvx512Bf16Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Bf16, ThreadCountDoesNotChangeResults, "avx512bf16", "matmul") {
  check_thread_count_invariant(kAvx512Bf16Matmul);
}

PAGODA_KERNEL_TABLE_TEST(MatmulAvx512Bf16, BatchSizeDoesNotChangeResults, "avx512bf16", "matmul") {
  check_batch_invariant(kAvx512Bf16Matmul);
}

// The packed view keeps the weight's type and shape; its bytes (panels of 8 rows, the last one
// padded) are the row-major bytes rearranged: each packed element found where the layout says.
PAGODA_KERNEL_TABLE_TEST(PackMatmulWeightAvx2, RearrangesEveryRowIntoPanels, "avx2", "pack_matmul_weight") {
  for (DType t : kAllTypes) {
    const int64_t n = 13, k = fits(t, 64) ? 64 : 256;
    Problem p = make_problem(t, 1, k, n, 3);
    EXPECT_EQ(p.packed.layout, TensorLayout::kBackendPacked);
    EXPECT_EQ(p.packed.dtype, t);
    EXPECT_EQ(p.packed.shape_string(), "[13, " + std::to_string(k) + "]");
    // Legacy types (x86_kernels.h): per block the 8 rows' d, m (q4_1 / q5_1), fifth bits (q5_0 /
    // q5_1), then the code groups; where each sits in the stored block.
    const bool has_m = t == DType::kQ4_1 || t == DType::kQ5_1, has_qh = t == DType::kQ5_0 || t == DType::kQ5_1;
    const int64_t fifth_at = 16 + (has_m ? 16 : 0), codes_at = fifth_at + (has_qh ? 32 : 0);
    const int64_t src_qh = has_m ? 4 : 2, src_qs = 2 + (has_m ? 2 : 0) + (has_qh ? 4 : 0);
    EXPECT_EQ(p.packed_storage.size(), static_cast<size_t>(2 * packed_panel_bytes(t, k)));
    const auto* packed = p.packed_storage.as<uint8_t>();
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* panel = packed + (j / 8) * packed_panel_bytes(t, k);
      const int64_t c = j % 8;
      const uint8_t* row = p.w.row(j);
      if (!is_quantized(t)) {
        const int64_t e = block_bytes(t);
        for (int64_t col = 0; col < k; ++col)
          ASSERT_EQ(std::memcmp(panel + (col * 8 + c) * e, row + col * e, e), 0) << dtype_name(t);
        continue;
      }
      if (t == DType::kQ4_K || t == DType::kQ5_K) {
        // x86_kernels.h: nibbles in lane order, q5_k's qh likewise, then unpacked scales, d, dmin
        const bool q5 = t == DType::kQ5_K;
        const int64_t block = q5 ? kQ5KPanelBlockBytes : kQ4KPanelBlockBytes, at = q5 ? 1280 : 1024;
        const int64_t stored = q5 ? 176 : 144, qs_at = q5 ? 48 : 16;  // d, dmin, scales[12], (qh[32]), qs
        for (int64_t b = 0; b < k / 256; ++b) {
          const uint8_t* pb = panel + b * block;
          const uint8_t* src = row + b * stored;
          QuantChunk chunks[8];
          dtype_traits(t).decode_chunks(src, chunks);
          for (int p4 = 0; p4 < 4; ++p4) {
            for (int g = 0; g < 8; ++g) {
              ASSERT_EQ(std::memcmp(pb + 256 * p4 + 32 * g + 4 * c, src + qs_at + 32 * p4 + 4 * g, 4), 0)
                  << dtype_name(t) << " row " << j << " pair " << p4 << " group " << g;
            }
          }
          for (int g = 0; q5 && g < 8; ++g) {
            ASSERT_EQ(std::memcmp(pb + 1024 + 32 * g + 4 * c, src + 16 + 4 * g, 4), 0) << "q5_k qh group " << g;
          }
          for (int sb = 0; sb < 8; ++sb) {
            EXPECT_EQ(pb[at + 8 * sb + c], chunks[sb].sc[0]) << dtype_name(t) << " scale " << sb;
            EXPECT_EQ(pb[at + 64 + 8 * sb + c], chunks[sb].mn[0]) << dtype_name(t) << " min " << sb;
          }
          ASSERT_EQ(std::memcmp(pb + at + 128 + 2 * c, src, 2), 0) << dtype_name(t) << " d";
          ASSERT_EQ(std::memcmp(pb + at + 144 + 2 * c, src + 2, 2), 0) << dtype_name(t) << " dmin";
        }
        continue;
      }
      if (t == DType::kQ6_K) {  // x86_kernels.h: ql / qh runs in lane order, then scales, d
        for (int64_t b = 0; b < k / 256; ++b) {
          const uint8_t* pb = panel + b * kQ6KPanelBlockBytes;
          const uint8_t* src = row + b * 210;  // ql[128], qh[64], scales[16], d
          for (int h = 0; h < 2; ++h) {
            const int64_t runs[3] = {64 * h, 64 * h + 32, 128 + 32 * h};
            for (int a = 0; a < 3; ++a) {
              for (int g = 0; g < 8; ++g) {
                ASSERT_EQ(std::memcmp(pb + 768 * h + 256 * a + 32 * g + 4 * c, src + runs[a] + 4 * g, 4), 0)
                    << "q6_k row " << j << " half " << h << " run " << a << " group " << g;
              }
            }
          }
          for (int i = 0; i < 16; ++i) EXPECT_EQ(pb[1536 + 8 * i + c], src[192 + i]) << "q6_k scale " << i;
          ASSERT_EQ(std::memcmp(pb + 1664 + 2 * c, src + 208, 2), 0) << "q6_k d";
        }
        continue;
      }
      if (t == DType::kQ2_K || t == DType::kQ3_K) {
        // x86_kernels.h: qs runs (q3_k: and hmask) in lane order, then the 16 scales, d (dmin)
        const bool q3 = t == DType::kQ3_K;
        const int64_t block = q3 ? kQ3KPanelBlockBytes : kQ2KPanelBlockBytes, scales_at = q3 ? 768 : 512;
        const int64_t qs_at = q3 ? 32 : 16, d_at = q3 ? 108 : 80;  // q2_k: scales[16], qs, d, dmin;
        for (int64_t b = 0; b < k / 256; ++b) {                     // q3_k: hmask[32], qs, scales[12], d
          const uint8_t* pb = panel + b * block;
          const uint8_t* src = row + b * block_bytes(t);
          for (int a = 0; a < 2; ++a) {
            for (int g = 0; g < 8; ++g) {
              ASSERT_EQ(std::memcmp(pb + 256 * a + 32 * g + 4 * c, src + qs_at + 32 * a + 4 * g, 4), 0)
                  << dtype_name(t) << " row " << j << " run " << a << " group " << g;
            }
          }
          QuantChunk chunks[8];
          dtype_traits(t).decode_chunks(src, chunks);
          for (int sb = 0; sb < 16; ++sb) {
            if (q3) {
              EXPECT_EQ(static_cast<int8_t>(pb[scales_at + 8 * sb + c]), chunks[sb / 2].sc[sb % 2]) << "q3_k scale " << sb;
            } else {
              EXPECT_EQ(pb[scales_at + 8 * sb + c], src[sb]) << "q2_k scale byte " << sb;
            }
          }
          for (int g = 0; q3 && g < 8; ++g) {
            ASSERT_EQ(std::memcmp(pb + 512 + 32 * g + 4 * c, src + 4 * g, 4), 0) << "q3_k hmask group " << g;
          }
          ASSERT_EQ(std::memcmp(pb + (q3 ? 896 : 640) + 2 * c, src + d_at, 2), 0) << dtype_name(t) << " d";
          if (!q3) {
            ASSERT_EQ(std::memcmp(pb + 656 + 2 * c, src + 82, 2), 0) << "q2_k dmin";
          }
        }
        continue;
      }
      const int64_t blk = block_bytes(t), groups = t == DType::kQ8_0 ? 8 : 4;
      for (int64_t b = 0; b < k / 32; ++b) {
        const uint8_t* pb = panel + b * 8 * blk;
        const uint8_t* src = row + b * blk;
        ASSERT_EQ(std::memcmp(pb + 2 * c, src, 2), 0) << dtype_name(t) << " scale";
        if (has_m) {
          ASSERT_EQ(std::memcmp(pb + 16 + 2 * c, src + 2, 2), 0) << dtype_name(t) << " m";
        }
        for (int e = 0; has_qh && e < 32; ++e) {  // element e's fifth bit: byte e % 4 of row c's word,
          const int h = e % 16 / 4, bit = 2 * h + (e < 16 ? 0 : 1);  // bit 2h (e < 16) or 2h + 1
          EXPECT_EQ((pb[fifth_at + 4 * c + e % 4] >> bit) & 1, (src[src_qh + e / 8] >> (e % 8)) & 1)
              << dtype_name(t) << " row " << j << " block " << b << " fifth bit of element " << e;
        }
        for (int64_t g = 0; g < groups; ++g)
          ASSERT_EQ(std::memcmp(pb + codes_at + 32 * g + 4 * c, src + src_qs + 4 * g, 4), 0)
              << dtype_name(t) << " row " << j << " block " << b << " group " << g;
      }
    }
    // Rows 13..15 (panel rows 5..7) of the last panel are padding: all zero.
    auto panel_row_of_byte = [&](int64_t i) -> int64_t {
      if (t == DType::kQ4_K || t == DType::kQ5_K) {
        const int64_t at = t == DType::kQ5_K ? 1280 : 1024;
        const int64_t in_block = i % (t == DType::kQ5_K ? kQ5KPanelBlockBytes : kQ4KPanelBlockBytes);
        return in_block < at ? in_block % 32 / 4 : in_block < at + 128 ? in_block % 8 : (in_block - at - 128) % 16 / 2;
      }
      if (t == DType::kQ6_K) {
        const int64_t in_block = i % kQ6KPanelBlockBytes;
        return in_block < 1536 ? in_block % 32 / 4 : in_block < 1664 ? in_block % 8 : (in_block - 1664) / 2;
      }
      if (t == DType::kQ2_K || t == DType::kQ3_K) {
        const int64_t scales_at = t == DType::kQ3_K ? 768 : 512, d_at = scales_at + 128;
        const int64_t in_block = i % (t == DType::kQ3_K ? kQ3KPanelBlockBytes : kQ2KPanelBlockBytes);
        return in_block < scales_at ? in_block % 32 / 4 : in_block < d_at ? in_block % 8 : (in_block - d_at) % 16 / 2;
      }
      if (!is_quantized(t)) return i / block_bytes(t) % 8;
      const int64_t in_block = i % (8 * block_bytes(t));
      if (in_block < fifth_at) return in_block % 16 / 2;  // d, m: 2 bytes per row
      return (in_block - fifth_at) % 32 / 4;              // fifth bits, codes: 4 bytes per row
    };
    const uint8_t* last = packed + packed_panel_bytes(t, k);
    for (int64_t i = 0; i < packed_panel_bytes(t, k); ++i) {
      if (panel_row_of_byte(i) >= 5) {
        ASSERT_EQ(last[i], 0) << dtype_name(t) << " byte " << i;
      }
    }
  }
}

PAGODA_KERNEL_TABLE_TEST(ActivationBlockSumsAvx2, SumsEachBlock, "avx2", "matmul") {
  std::mt19937 rng(9);
  std::vector<BlockQ8Act> blocks(5);
  for (auto& b : blocks) {
    b.d = 1;
    for (auto& q : b.qs) q = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
  }
  for (auto& q : blocks[3].qs) q = -127;  // the extremes
  for (auto& q : blocks[4].qs) q = 127;
  std::vector<int32_t> sums(5);
  activation_block_sums_avx2(blocks.data(), 5, sums.data());
  for (size_t b = 0; b < blocks.size(); ++b) {
    int32_t want = 0;
    for (int8_t q : blocks[b].qs) want += q;
    EXPECT_EQ(sums[b], want) << "block " << b;
  }
}

PAGODA_KERNEL_TABLE_TEST(QuantizeActivationAvx2, MatchesScalarBitForBit, "avx2", "matmul") {
  std::mt19937 rng(5);
  const int64_t m = 3, k = 256;
  std::vector<float> x(static_cast<size_t>(m * k));
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  for (auto& v : x) v = dist(rng);
  for (int64_t j = 32; j < 64; ++j) x[j] = 0;                 // a zero block
  for (int64_t j = 64; j < 96; ++j) x[j] = 0.5f * (j - 80);   // halves: ties round to even
  x[100] = 1e-30f;                                            // tiny values
  for (int64_t j = 128; j < 160; ++j) x[j] = (j % 2 ? 1 : -1) * 3.0e38f / (j - 120);  // huge
  std::vector<BlockQ8Act> want(static_cast<size_t>(m * k / 32)), got(want.size());
  for (int64_t i = 0; i < m; ++i) quantize_activation_row(x.data() + i * k, want.data() + i * k / 32, k);
  quantize_activation_rows_avx2(x.data(), m, k, got.data());
  for (size_t b = 0; b < want.size(); ++b) {
    EXPECT_EQ(got[b].d, want[b].d) << "block " << b;
    for (int j = 0; j < 32; ++j) EXPECT_EQ(got[b].qs[j], want[b].qs[j]) << "block " << b << " [" << j << "]";
  }
}

// The int8 path of every quantized type against the exact product of the f32 activations with the
// dequantized weights (float64): the only difference allowed is the activations' rounding to
// their blocks, at most d_x / 2 per element, so |error| <= sum over elements of d_x / 2 * |w|.
PAGODA_KERNEL_TABLE_TEST(MatmulAvx2, QuantizedActivationErrorWithinRoundingBound, "avx2", "matmul") {
  for (DType t : kAllTypes) {
    if (!is_quantized(t)) continue;
    const int64_t m = 6, k = 512, n = 40;
    Problem p = make_problem(t, m, k, n, 31);
    std::vector<float> y(static_cast<size_t>(m * n));
    matmul_avx2_pooled(p.x.data(), m, p.packed, y.data(), nullptr);
    std::vector<float> row(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      dequantize_row(t, p.w.row(j), row.data(), k);
      for (int64_t i = 0; i < m; ++i) {
        double exact = 0, bound = 0;
        for (int64_t b = 0; b < k / 32; ++b) {
          double amax = 0;
          for (int e = 0; e < 32; ++e) amax = std::max(amax, std::fabs(double{p.x[i * k + b * 32 + e]}));
          for (int e = 0; e < 32; ++e) {
            const int64_t c = b * 32 + e;
            exact += double{p.x[i * k + c]} * row[c];
            bound += amax / 127 / 2 * std::fabs(double{row[c]});
          }
        }
        EXPECT_LE(std::fabs(y[i * n + j] - exact), bound * 1.001 + 1e-5)
            << dtype_name(t) << " y[" << i << ", " << j << "]";
      }
    }
  }
}

// ---- matmul_int: IntWeight codes ----

struct IntProblem {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<int32_t> zeros;
  IntWeight w;
  Buffer packed_storage;
  IntWeight packed;
  std::vector<float> x;
};

// zeros: zero points across their whole range ([-8, 8] for int4 codes, [-128, 128] for int8: GPTQ's
// v1 zeros reach the top one).
IntProblem make_int_problem(int bits, int64_t m, int64_t k, int64_t n, int64_t group, float input_scale,
                            uint32_t seed, bool zeros = false) {
  std::mt19937 rng(seed);
  IntProblem p;
  const int64_t row_bytes = bits == 8 ? k : k / 2;
  p.codes.resize(static_cast<size_t>(n * row_bytes));
  for (auto& c : p.codes) c = static_cast<uint8_t>(rng());  // every code, -128 and -8 included
  p.scales.resize(static_cast<size_t>(n * (k / group)));
  std::uniform_real_distribution<float> sdist(1e-3f, 2e-2f), xdist(-2.0f, 2.0f);
  for (auto& s : p.scales) s = sdist(rng);
  p.w.codes = p.codes.data();
  p.w.bits = bits;
  p.w.n = n;
  p.w.k = k;
  p.w.group_size = group;
  p.w.scales = p.scales.data();
  p.w.input_scale = input_scale;
  if (zeros) {
    const int top = bits == 8 ? 128 : 8;
    p.zeros.resize(p.scales.size());
    for (auto& z : p.zeros) z = static_cast<int32_t>(rng() % (2 * top + 1)) - top;
    p.w.zero_points = p.zeros.data();
  }
  p.packed = pack_int_weight_avx2(kernel_table_testing::test_context(), p.w, &p.packed_storage);
  p.x.resize(static_cast<size_t>(m * k));
  for (auto& v : p.x) v = xdist(rng);
  if (m > 2) {
    for (int64_t t = 0; t < k; ++t) p.x[static_cast<size_t>(k + t)] = 0;  // an all-zero row
  }
  return p;
}

// Bit for bit the reference, for both code widths, per channel (odd k: padded columns) and in
// groups, per-token and static activation scales (a static scale small enough to saturate), with
// and without zero points, row counts around the tiles, output counts around the panels, threaded
// or not.
using MatmulIntPooled = void (*)(const float* x, int64_t m, const IntWeight& w, float* y, ThreadPool* pool);

void check_matmul_int_matches_reference(MatmulIntPooled matmul_int) {
  ThreadPool pool(3);
  uint32_t seed = 1;
  for (int bits : {8, 4}) {
    for (int64_t k : {8, 36, 64, 172, 256, 1088}) {
      if (bits == 4 && k % 2 != 0) continue;
      for (int64_t group : {k, int64_t{32}, int64_t{64}}) {
        if (group != k && k % group != 0) continue;
        for (float input_scale : {0.0f, 0.02f, 0.004f, -1.0f, -2.0f}) {
          // The last two passes with zero points: per-token scales (-1), the static 0.02 (-2).
          const bool zeros = input_scale < 0;
          const float scale = input_scale == -2.0f ? 0.02f : (zeros ? 0.0f : input_scale);
          for (int64_t m : {1, 3, 4, 9}) {
            for (int64_t n : {1, 8, 13, 67}) {
              IntProblem p = make_int_problem(bits, m, k, n, group, scale, seed++, zeros);
              std::vector<float> want(static_cast<size_t>(m * n)), got(want.size(), NAN), threaded(want.size(), NAN);
              reference_kernels().matmul_int(kernel_table_testing::test_context(), p.x.data(), m, p.w, want.data());
              matmul_int(p.x.data(), m, p.packed, got.data(), nullptr);
              matmul_int(p.x.data(), m, p.packed, threaded.data(), &pool);
              ASSERT_EQ(got, want) << "bits " << bits << " k " << k << " group " << group << " input_scale "
                                   << input_scale << " zeros " << zeros << " m " << m << " n " << n;
              ASSERT_EQ(threaded, want) << "threaded, bits " << bits << " k " << k << " m " << m << " n " << n;
            }
          }
        }
      }
    }
  }
}

// A row alone and in batches of other sizes: the same bits (exact int32 dots per group).
void check_matmul_int_batch_invariant(MatmulIntPooled matmul_int) {
  for (int bits : {8, 4, -4}) {  // -4: int4 with zero points
    const int64_t m = 23, k = 512, n = 45;
    IntProblem p = make_int_problem(bits < 0 ? 4 : bits, m, k, n, bits == 8 ? k : 128, 0, 99, bits < 0);
    std::vector<float> alone(static_cast<size_t>(m * n)), batched(alone.size());
    for (int64_t i = 0; i < m; ++i) matmul_int(p.x.data() + i * k, 1, p.packed, alone.data() + i * n, nullptr);
    for (int64_t i = 0; i < m; i += 5) {
      matmul_int(p.x.data() + i * k, std::min<int64_t>(5, m - i), p.packed, batched.data() + i * n, nullptr);
    }
    EXPECT_EQ(alone, batched) << "bits " << bits;
  }
}

PAGODA_KERNEL_TABLE_TEST(MatmulIntAvx2, MatchesReferenceBitForBit, "avx2", "matmul_int pack_int_weight") {
  check_matmul_int_matches_reference(matmul_int_avx2_pooled);
}

PAGODA_KERNEL_TABLE_TEST(MatmulIntAvx2, BatchSizeDoesNotChangeResults, "avx2", "matmul_int") {
  check_matmul_int_batch_invariant(matmul_int_avx2_pooled);
}

// The avxvnni table: its matmul_int on vpdpbusd; its other entries are the avx2 table's very
// functions, tested above.
PAGODA_KERNEL_TABLE_TEST(MatmulIntAvxVnni, MatchesReferenceBitForBit, "avxvnni", "matmul_int pack_int_weight") {
  check_matmul_int_matches_reference(matmul_int_avxvnni_pooled);
}

PAGODA_KERNEL_TABLE_TEST(MatmulIntAvxVnni, BatchSizeDoesNotChangeResults, "avxvnni", "matmul_int") {
  check_matmul_int_batch_invariant(matmul_int_avxvnni_pooled);
}

// The avx512vnni table: its matmul_int on 512-bit vpdpbusd, two panels per vector, int8 inputs
// unsigned (x + 128); its other entries but matmul are the avx2 table's very functions, tested there.
// The problems' odd panel counts (n = 67: 9 panels) take the repeated-half tail; m = 9 a tile of
// 8 rows and one of 1.
PAGODA_KERNEL_TABLE_TEST(MatmulIntAvx512Vnni, MatchesReferenceBitForBit, "avx512vnni", "matmul_int pack_int_weight") {
  check_matmul_int_matches_reference(matmul_int_avx512vnni_pooled);
}

PAGODA_KERNEL_TABLE_TEST(MatmulIntAvx512Vnni, BatchSizeDoesNotChangeResults, "avx512vnni", "matmul_int") {
  check_matmul_int_batch_invariant(matmul_int_avx512vnni_pooled);
}

PAGODA_KERNEL_TABLE_TEST(QuantizeActivationInt8Avx2, MatchesScalarBitForBit, "avx2", "matmul_int") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  for (int64_t k : {1, 31, 32, 100, 257}) {
    std::vector<float> x(static_cast<size_t>(k));
    for (auto& v : x) v = dist(rng);
    if (k > 40) {
      for (int64_t t = 0; t < 8; ++t) x[static_cast<size_t>(t)] = 0.5f * static_cast<float>(t) - 1.75f;  // ties
    }
    for (float s : {0.0f, 0.01f, 0.05f}) {
      const int64_t kp = (k + 7) / 8 * 8;
      std::vector<int8_t> want(static_cast<size_t>(k)), got(static_cast<size_t>(kp), 99);
      const float ws = quantize_activation_row_int8(x.data(), k, s, want.data());
      const float gs = quantize_activation_row_int8_avx2(x.data(), k, kp, s, got.data());
      EXPECT_EQ(gs, ws) << k << " " << s;
      for (int64_t t = 0; t < k; ++t) ASSERT_EQ(got[static_cast<size_t>(t)], want[static_cast<size_t>(t)]) << k << " " << s << " [" << t << "]";
      for (int64_t t = k; t < kp; ++t) EXPECT_EQ(got[static_cast<size_t>(t)], 0) << "padding " << t;
    }
  }
}

TEST(CpuBackend, ParsesIsaNames) {
  EXPECT_EQ(*parse_cpu_isa(""), "auto");
  EXPECT_EQ(*parse_cpu_isa("auto"), "auto");
  EXPECT_EQ(*parse_cpu_isa("avx512bf16"), "avx512bf16");
  EXPECT_EQ(*parse_cpu_isa("avx512vnni"), "avx512vnni");
  EXPECT_EQ(*parse_cpu_isa("avx512"), "avx512");
  EXPECT_EQ(*parse_cpu_isa("avxvnni"), "avxvnni");
  EXPECT_EQ(*parse_cpu_isa("avx2"), "avx2");
  EXPECT_EQ(*parse_cpu_isa("scalar"), "scalar");
  auto bad = parse_cpu_isa("avx1024");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "unknown CPU ISA 'avx1024' (auto, avx512bf16, avx512vnni, avx512, avxvnni, avx2 or scalar)");
}

// The first table each CPU family's features admit (the `needs` string names the same features):
// Zen 4 and Ice Lake / Cascade Lake have AVX-512 VNNI without AVX-VNNI and take the AVX-512
// tables (their 256-bit VNNI leaves are EVEX-encoded); Alder Lake takes avxvnni; Skylake-X
// (AVX-512 without VNNI) avx512.
TEST(CpuBackend, EachCpuFamilyGetsTheTablesItsFeaturesAllow) {
  auto best = [](const CpuFeatures& f) -> std::string {
    for (const CpuKernelTable& t : cpu_kernel_tables()) {
      if (t.supported(f)) return std::string(t.name);
    }
    return "reference";
  };
  auto with = [](CpuFeatures f, std::initializer_list<const char*> flags) {
    f.flags.insert(f.flags.end(), flags.begin(), flags.end());
    return f;
  };
  const CpuFeatures avx2{.arch = "x86_64", .flags = {"avx2", "fma", "f16c"}};
  const CpuFeatures skylake_x = with(avx2, {"avx512f", "avx512bw", "avx512vl"});
  const CpuFeatures ice_lake = with(skylake_x, {"avx512vnni"});
  const CpuFeatures zen4 = with(ice_lake, {"avx512bf16"});
  const CpuFeatures zen5 = with(zen4, {"avxvnni"});
  const CpuFeatures alder_lake = with(avx2, {"avxvnni"});
  CpuFeatures no_vl = zen4;
  std::erase(no_vl.flags, "avx512vl");
  EXPECT_EQ(best(CpuFeatures{}), "reference");
  EXPECT_EQ(best(avx2), "avx2");
  EXPECT_EQ(best(skylake_x), "avx512");
  EXPECT_EQ(best(ice_lake), "avx512vnni");
  EXPECT_EQ(best(zen4), "avx512bf16");
  EXPECT_EQ(best(zen5), "avx512bf16");
  EXPECT_EQ(best(alder_lake), "avxvnni");
  EXPECT_EQ(best(no_vl), "avx512");
  for (const CpuKernelTable& t : cpu_kernel_tables()) {
    // A table needs AVX-VNNI exactly where its `needs` says so.
    const bool names_avxvnni = (" " + std::string(t.needs) + " ").find(" avxvnni ") != std::string::npos;
    EXPECT_EQ(t.supported(zen4), t.supported(zen5) && !names_avxvnni) << t.name;
  }
}

// The best table: avx512bf16 where the CPU also has AVX-512 BF16 (the avx512vnni table but its
// matmul), else avx512vnni where the CPU has AVX-512 F, BW, VL and VNNI, with or without AVX-VNNI
// (the avx2 table's entries but matmul and matmul_int), else avxvnni where it has AVX-VNNI (its matmul and matmul_int; the
// other entries the avx2 table's), else avx2, else the reference.
TEST(CpuBackend, PicksAvx2KernelsUnlessForcedToReference) {
  auto forced = CpuBackend::create(CpuBackendOptions{.isa = "scalar"});
  ASSERT_TRUE(forced.ok());
  const CpuBackend& reference = **forced;
  EXPECT_EQ(reference.kernels().table().matmul, reference_kernels().matmul);
  EXPECT_EQ(reference.kernels().table().paged_attention, reference_kernels().paged_attention);
  EXPECT_NE(reference.description().find("reference"), std::string::npos);
  auto best = CpuBackend::create();
  ASSERT_TRUE(best.ok());
  const CpuBackend& fast = **best;
  auto avx2 = CpuBackend::create(CpuBackendOptions{.isa = "avx2"});
  EXPECT_EQ(avx2.ok(), has_avx2()) << (avx2.ok() ? "" : avx2.status().message());
  if (avx2.ok()) {
    EXPECT_EQ((*avx2)->kernels().table().matmul, &matmul_avx2);
    EXPECT_EQ((*avx2)->kernels().table().pack_matmul_weight, &pack_matmul_weight_avx2);
  }
  EXPECT_EQ(reference.kernels().table().pack_matmul_weight, nullptr);
  const bool vnni = has_avx2() && cpu_features().has("avxvnni");
  auto avxvnni = CpuBackend::create(CpuBackendOptions{.isa = "avxvnni"});
  EXPECT_EQ(avxvnni.ok(), vnni) << (avxvnni.ok() ? "" : avxvnni.status().message());
  const bool avx512 = has_avx2() && cpu_features().has_all("avx512f avx512bw avx512vl avx512vnni");
  auto avx512vnni = CpuBackend::create(CpuBackendOptions{.isa = "avx512vnni"});
  EXPECT_EQ(avx512vnni.ok(), avx512) << (avx512vnni.ok() ? "" : avx512vnni.status().message());
  const bool avx512_fma = has_avx2() && cpu_features().has("avx512f") && cpu_features().has("avx512bw");
  auto avx512_table = CpuBackend::create(CpuBackendOptions{.isa = "avx512"});
  EXPECT_EQ(avx512_table.ok(), avx512_fma) << (avx512_table.ok() ? "" : avx512_table.status().message());
  if (avx512_fma) {
    EXPECT_EQ((*avx512_table)->kernels().table().matmul, &matmul_avx512);
    EXPECT_EQ((*avx512_table)->kernels().table().matmul_int, &matmul_int_avx2);
  }
  const bool bf16 = avx512 && cpu_features().has("avx512bf16");
  auto avx512bf16 = CpuBackend::create(CpuBackendOptions{.isa = "avx512bf16"});
  EXPECT_EQ(avx512bf16.ok(), bf16) << (avx512bf16.ok() ? "" : avx512bf16.status().message());
  if (bf16) {
    EXPECT_EQ(fast.kernels().table().matmul, &matmul_avx512bf16);
    EXPECT_EQ(fast.kernels().table().matmul_int, &matmul_int_avx512vnni);
    EXPECT_EQ(fast.kernels().table().pack_matmul_weight, &pack_matmul_weight_avx512bf16);
    EXPECT_NE(fast.description().find("avx512bf16"), std::string::npos) << fast.description();
    EXPECT_EQ((*avx512vnni)->kernels().table().matmul, &matmul_avx512vnni);
  } else if (avx512) {
    EXPECT_EQ(fast.kernels().table().matmul, &matmul_avx512vnni);
    EXPECT_EQ(fast.kernels().table().matmul_int, &matmul_int_avx512vnni);
    EXPECT_EQ(fast.kernels().table().pack_matmul_weight, &pack_matmul_weight_avx2);
    EXPECT_NE(fast.description().find("avx512vnni"), std::string::npos) << fast.description();
    EXPECT_EQ(fast.kernels().table().rms_norm, &rms_norm_avx2);
    if (vnni) {
      EXPECT_EQ((*avxvnni)->kernels().table().matmul_int, &matmul_int_avxvnni);
    }
  } else if (avx512_fma) {
    EXPECT_EQ(fast.kernels().table().matmul, &matmul_avx512);
    EXPECT_NE(fast.description().find("avx512"), std::string::npos) << fast.description();
  } else if (vnni) {
    EXPECT_EQ(fast.kernels().table().matmul, &matmul_avxvnni);
    EXPECT_EQ(fast.kernels().table().matmul_int, &matmul_int_avxvnni);
    EXPECT_EQ(fast.kernels().table().pack_matmul_weight, &pack_matmul_weight_avx2);
    EXPECT_NE(fast.description().find("avxvnni"), std::string::npos) << fast.description();
  } else if (has_avx2()) {
    EXPECT_EQ(fast.kernels().table().matmul, &matmul_avx2);
    EXPECT_EQ(fast.kernels().table().matmul_int, &matmul_int_avx2);
    EXPECT_NE(fast.description().find("avx2"), std::string::npos) << fast.description();
  } else {
    EXPECT_EQ(fast.kernels().table().matmul, reference_kernels().matmul);
  }
  const KernelTable& ref = reference_kernels();
  if (has_avx2()) {
    // The AVX-512 tables (avx512, avx512vnni, avx512bf16) take the 16-lane attention.
    EXPECT_EQ(fast.kernels().table().paged_attention,
              avx512_fma ? &paged_attention_avx512 : &paged_attention_avx2);
    EXPECT_EQ(fast.kernels().table().rms_norm, &rms_norm_avx2);
    EXPECT_EQ(fast.kernels().table().silu_mul, &silu_mul_avx2);
    EXPECT_EQ(fast.kernels().table().add, &add_avx2);
  } else {
    EXPECT_EQ(fast.kernels().table().paged_attention, ref.paged_attention);
    EXPECT_EQ(fast.kernels().table().rms_norm, ref.rms_norm);
  }
  // These stay on the reference kernels.
  EXPECT_EQ(fast.kernels().table().embedding, ref.embedding);
  EXPECT_EQ(fast.kernels().table().rope, ref.rope);
  EXPECT_EQ(fast.kernels().table().store_kv, ref.store_kv);
}

}  // namespace
}  // namespace pagoda::cpu
