// Checks the AVX2 matmul against the reference matmul on random shapes: every weight type, input
// row counts around the 4-row register tile, row lengths with odd tails, output row counts
// around the 4-row and 16-row blocks, k slices (batched inputs) and the threaded split.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/reference/reference_kernels.h"
#include "backends/cpu/kernels/x86/x86_kernels.h"
#include "base/thread_pool.h"
#include "tensor/convert.h"
#include "tensor/tensor.h"

namespace pagoda::cpu {
namespace {

bool has_avx2() {
  const CpuFeatures& f = cpu_features();
  return f.avx2 && f.fma && f.f16c;
}

#define SKIP_WITHOUT_AVX2() \
  if (!has_avx2()) GTEST_SKIP() << "CPU lacks avx2/fma/f16c: " << cpu_features().to_string()

constexpr DType kAllTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0};

// A random [n, k] weight matrix of type t, and x: [m, k] f32.
struct Problem {
  std::vector<uint8_t> w_bytes;
  Tensor w;
  std::vector<float> x;
};

Problem make_problem(DType t, int64_t m, int64_t k, int64_t n, uint32_t seed) {
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
  p.x.resize(static_cast<size_t>(m * k));
  for (auto& v : p.x) v = dist(rng);
  return p;
}

// Expects y to equal the reference matmul within f32 reassociation error: 1e-5 of the sum of
// |x * w| over the row.
void expect_matches_reference(const Problem& p, int64_t m, const std::vector<float>& y,
                              const std::string& what) {
  const int64_t n = p.w.num_rows(), k = p.w.row_len();
  std::vector<float> want(static_cast<size_t>(m * n));
  reference_kernels().matmul(p.x.data(), m, p.w, want.data());
  std::vector<float> row(static_cast<size_t>(k));
  int failures = 0;
  for (int64_t j = 0; j < n && failures < 5; ++j) {
    dequantize_row(p.w.dtype, p.w.row(j), row.data(), k);
    for (int64_t i = 0; i < m; ++i) {
      double mag = 0;
      for (int64_t t = 0; t < k; ++t)
        mag += std::fabs(static_cast<double>(p.x[i * k + t]) * row[t]);
      const float got = y[i * n + j], ref = want[i * n + j];
      if (!(std::fabs(got - ref) <= 1e-5 * mag + 1e-30)) {
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

TEST(MatmulAvx2, MatchesReferenceOnSmallShapes) {
  SKIP_WITHOUT_AVX2();
  uint32_t seed = 1;
  for (DType t : kAllTypes) {
    for (int64_t k : {32, 64, 96, 100, 257}) {
      if (is_quantized(t) && k % 32 != 0) continue;
      for (int64_t m : {1, 2, 3, 4, 5, 7, 16, 33}) {
        for (int64_t n : {1, 5, 64, 67}) {
          Problem p = make_problem(t, m, k, n, seed++);
          std::vector<float> y(static_cast<size_t>(m * n), NAN);
          matmul_avx2_pooled(p.x.data(), m, p.w, y.data(), nullptr);
          expect_matches_reference(p, m, y, describe(t, m, k, n));
        }
      }
    }
  }
}

// Long rows: batched inputs take the k-sliced path (slices of 256..1024 plus a tail), decode the
// one-pass path; both through a 3-thread pool and through the backend's shared pool.
TEST(MatmulAvx2, MatchesReferenceOnLongRowsThreaded) {
  SKIP_WITHOUT_AVX2();
  ThreadPool pool(3);
  uint32_t seed = 1000;
  for (DType t : kAllTypes) {
    for (int64_t k : {1088, 2051}) {
      if (is_quantized(t) && k % 32 != 0) continue;
      for (int64_t m : {1, 6, 9}) {
        for (int64_t n : {37, 131}) {
          Problem p = make_problem(t, m, k, n, seed++);
          std::vector<float> y(static_cast<size_t>(m * n), NAN);
          matmul_avx2_pooled(p.x.data(), m, p.w, y.data(), &pool);
          expect_matches_reference(p, m, y, describe(t, m, k, n) + " pool(3)");
          std::vector<float> y2(static_cast<size_t>(m * n), NAN);
          matmul_avx2(p.x.data(), m, p.w, y2.data());
          expect_matches_reference(p, m, y2, describe(t, m, k, n) + " shared pool");
        }
      }
    }
  }
}

TEST(MatmulAvx2, ThreadCountDoesNotChangeResults) {
  SKIP_WITHOUT_AVX2();
  Problem p = make_problem(DType::kQ4_0, 5, 512, 300, 7);
  std::vector<float> one(5 * 300), many(5 * 300);
  matmul_avx2_pooled(p.x.data(), 5, p.w, one.data(), nullptr);
  ThreadPool pool(4);
  matmul_avx2_pooled(p.x.data(), 5, p.w, many.data(), &pool);
  EXPECT_EQ(one, many);  // each output is computed by one thread in the same order
}

TEST(CpuBackend, PicksAvx2MatmulUnlessForcedToReference) {
  CpuBackend reference(CpuBackendOptions{.force_reference = true});
  EXPECT_EQ(reference.kernels().matmul, reference_kernels().matmul);
  EXPECT_NE(reference.description().find("reference"), std::string::npos);
  CpuBackend fast;
  if (has_avx2()) {
    EXPECT_EQ(fast.kernels().matmul, &matmul_avx2);
    EXPECT_NE(fast.description().find("avx2"), std::string::npos) << fast.description();
  } else {
    EXPECT_EQ(fast.kernels().matmul, reference_kernels().matmul);
  }
  // Every other op stays on the reference kernels.
  EXPECT_EQ(fast.kernels().paged_attention, reference_kernels().paged_attention);
  EXPECT_EQ(fast.kernels().rms_norm, reference_kernels().rms_norm);
}

}  // namespace
}  // namespace pagoda::cpu
