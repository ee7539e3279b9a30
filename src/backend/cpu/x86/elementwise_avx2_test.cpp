// Checks the AVX2 element-wise kernels (RMSNorm, SiLU x up, add) against float64 math written
// here, on lengths with odd tails and extreme inputs, threaded and not; and that an element's
// value does not depend on the length of the buffer it is in.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernel_table_test_support.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "support/random_values.h"

namespace pagoda::cpu {
namespace {

using testing::random_floats;

PAGODA_KERNEL_TABLE_TEST(ElementwiseAvx2, RmsNormMatchesFloat64, "avx2", "rms_norm") {
  for (int64_t dim : {1, 7, 8, 33, 2048, 4097}) {
    for (int64_t rows : {1, 3, 40}) {  // 40 x 2048 and up take the threaded split
      auto x = random_floats(static_cast<size_t>(rows * dim), static_cast<uint32_t>(dim + rows), 3.0f);
      auto w = random_floats(static_cast<size_t>(dim), 7, 1.5f);
      std::vector<float> y(x.size());
      rms_norm_avx2(kernel_table_testing::test_context(), x.data(), w.data(), rows, dim, 1e-5f, y.data());
      for (int64_t r = 0; r < rows; ++r) {
        double ss = 0;
        for (int64_t i = 0; i < dim; ++i) ss += double{x[r * dim + i]} * x[r * dim + i];
        const double inv = 1.0 / std::sqrt(ss / static_cast<double>(dim) + 1e-5);
        for (int64_t i = 0; i < dim; ++i) {
          const double want = x[r * dim + i] * inv * w[i];
          ASSERT_NEAR(y[r * dim + i], want, 1e-5 * (std::fabs(want) + 1)) << dim << " " << r << " " << i;
        }
      }
      // In place (y aliases x), as the model calls it for q/k norms.
      std::vector<float> z = x;
      rms_norm_avx2(kernel_table_testing::test_context(), z.data(), w.data(), rows, dim, 1e-5f, z.data());
      EXPECT_EQ(z, y);
    }
  }
}

PAGODA_KERNEL_TABLE_TEST(ElementwiseAvx2, SiluMulMatchesFloat64, "avx2", "silu_mul") {
  for (int64_t n : {1, 5, 8, 29, 100000}) {  // 100000: the threaded split
    auto g = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n), 12.0f);
    auto u = random_floats(static_cast<size_t>(n), static_cast<uint32_t>(n + 1), 2.0f);
    if (n >= 8) {
      const float extremes[] = {0.0f, -0.0f, 100.0f, -100.0f, 1e4f, -1e4f, 88.5f, -88.5f};
      for (int i = 0; i < 8; ++i) g[static_cast<size_t>(i)] = extremes[i];
    }
    std::vector<float> out(static_cast<size_t>(n));
    silu_mul_avx2(kernel_table_testing::test_context(), g.data(), u.data(), n, out.data());
    for (int64_t i = 0; i < n; ++i) {
      const double want = g[i] / (1.0 + std::exp(-double{g[i]})) * u[i];
      ASSERT_NEAR(out[i], want, 2e-6 * (std::fabs(want) + 1e-3)) << "n=" << n << " g=" << g[i];
    }
    // out may alias gate.
    std::vector<float> in_place = g;
    silu_mul_avx2(kernel_table_testing::test_context(), in_place.data(), u.data(), n, in_place.data());
    EXPECT_EQ(in_place, out);
  }
}

PAGODA_KERNEL_TABLE_TEST(ElementwiseAvx2, ElementValueDoesNotDependOnBufferLength, "avx2", "silu_mul") {
  auto g = random_floats(37, 3, 6.0f);
  auto u = random_floats(37, 4, 2.0f);
  std::vector<float> full(37);
  silu_mul_avx2(kernel_table_testing::test_context(), g.data(), u.data(), 37, full.data());
  for (int64_t start = 0; start < 37; ++start) {
    for (int64_t n = 1; start + n <= 37; ++n) {
      std::vector<float> part(static_cast<size_t>(n));
      silu_mul_avx2(kernel_table_testing::test_context(), g.data() + start, u.data() + start, n, part.data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(part[i], full[start + i]) << start << " " << n;
    }
  }
}

PAGODA_KERNEL_TABLE_TEST(ElementwiseAvx2, AddIsExact, "avx2", "add") {
  for (int64_t n : {3, 16, 70001}) {
    auto y = random_floats(static_cast<size_t>(n), 1, 5.0f);
    auto x = random_floats(static_cast<size_t>(n), 2, 5.0f);
    std::vector<float> want = y;
    for (int64_t i = 0; i < n; ++i) want[i] += x[i];
    add_avx2(kernel_table_testing::test_context(), y.data(), x.data(), n);
    EXPECT_EQ(y, want);
  }
}

}  // namespace
}  // namespace pagoda::cpu
