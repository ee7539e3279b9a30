// GPTQ: its factor and one sweep worked out by hand, round-to-nearest where the inputs are
// uncorrelated (byte for byte against the types' quantizers), and a lower output error than
// round-to-nearest on correlated inputs, measured in double here, for every GGUF block type and
// the int4 / int8 groups.
#include "tensor/gptq.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tensor/convert.h"

namespace pagoda {
namespace {

// Rounds to integers: the grid of the hand-worked example.
class IntegerRounder final : public GptqGroupRounder {
 public:
  void begin(int64_t, int64_t, const float*) override {}
  float round(int64_t, float v) override { return std::nearbyint(v); }
  void end() override {}
};

TEST(Gptq, FactorAndSweepWorkedByHand) {
  // Tokens (1, 1), (1, 0), (0, 1): H = [[2, 1], [1, 2]], H^-1 = [[2, -1], [-1, 2]] / 3, whose
  // upper factor is U00 = sqrt(2/3), U01 = -(1/3) / sqrt(2/3), U11 = sqrt(2/3 - U01^2) = sqrt(1/2).
  GptqHessian h(2);
  const float x[] = {1, 1, 1, 0, 0, 1};
  h.add(x, 3);
  EXPECT_EQ(h.tokens(), 3);
  EXPECT_EQ(h.at(0, 0), 2);
  EXPECT_EQ(h.at(0, 1), 1);
  EXPECT_EQ(h.at(1, 0), 1);
  EXPECT_EQ(h.at(1, 1), 2);
  auto u = gptq_inverse_factor(h, /*damp=*/0);
  ASSERT_TRUE(u.ok()) << u.status().message();
  EXPECT_NEAR((*u)[0], std::sqrt(2.0 / 3), 1e-12);
  EXPECT_NEAR((*u)[1], -(1.0 / 3) / std::sqrt(2.0 / 3), 1e-12);
  EXPECT_EQ((*u)[2], 0);
  EXPECT_NEAR((*u)[3], std::sqrt(0.5), 1e-12);

  // w = (0.4, 0.4): column 0 rounds to 0, an error of 0.4, and column 1 takes on
  // -0.4 * U01 / U00 = 0.4 * (1/3) / (2/3) = 0.2: 0.6 rounds to 1. Round-to-nearest gives (0, 0);
  // the output error e^T H e is 0.28 for (0, 1) against 0.48 for (0, 0).
  float w[] = {0.4f, 0.4f};
  gptq_sweep(w, 1, 2, 1, *u, [] { return std::make_unique<IntegerRounder>(); }, nullptr);
  EXPECT_EQ(w[0], 0.0f);
  EXPECT_EQ(w[1], 1.0f);
}

TEST(Gptq, HessianSumsOuterProducts) {
  std::mt19937 rng(7);
  std::normal_distribution<float> dist;
  const int64_t k = 9, m = 13;
  std::vector<float> x(static_cast<size_t>(k * m));
  for (float& v : x) v = dist(rng);
  GptqHessian h(k);
  h.add(x.data(), 5);
  h.add(x.data() + 5 * k, m - 5);
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < k; ++j) {
      double want = 0;
      for (int64_t t = 0; t < m; ++t) want += static_cast<double>(x[t * k + i]) * x[t * k + j];
      EXPECT_NEAR(h.at(i, j), want, 1e-4 * (1 + std::fabs(want))) << i << ", " << j;
    }
  }
}

TEST(Gptq, RefusesInputsWithNan) {
  GptqHessian h(2);
  const float x[] = {1, NAN};
  h.add(x, 1);
  auto u = gptq_inverse_factor(h, 0.01);
  ASSERT_FALSE(u.ok());
  EXPECT_NE(u.status().message().find("NaN"), std::string::npos) << u.status().message();
}

TEST(Gptq, NoInputsIsRoundToNearest) {
  GptqHessian h(3);
  auto u = gptq_inverse_factor(h, 0.01);
  ASSERT_TRUE(u.ok());
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = 0; j < 3; ++j) EXPECT_EQ((*u)[static_cast<size_t>(i * 3 + j)], i == j ? 1.0 : 0.0);
  }
}

const DType kBlockTypes[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1, DType::kQ5_0, DType::kQ5_1,
                             DType::kQ2_K, DType::kQ3_K, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::vector<float> decode_rows(DType t, const std::vector<uint8_t>& bytes, int64_t rows, int64_t cols) {
  const int64_t row_bytes = cols / dtype_traits(t).block_elems * dtype_traits(t).block_bytes;
  std::vector<float> out(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) dequantize_row(t, bytes.data() + r * row_bytes, out.data() + r * cols, cols);
  return out;
}

// Uncorrelated inputs (H = I): no error is spread, and each element goes to the nearest value of
// its block's grid, the grid the type's quantizer chose. The quantizers of the K-quants and of
// Q4_1 / Q5_x round against their stored scales too, so their bytes are GPTQ's; Q8_0's and Q4_0's
// round against the unrounded scale, so GPTQ's values are only as close or closer.
TEST(Gptq, UncorrelatedInputsRoundToNearest) {
  const int64_t rows = 6, cols = 512;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist;
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = dist(rng);
  GptqHessian h(cols);
  std::vector<float> unit(static_cast<size_t>(cols), 0.0f);
  for (int64_t i = 0; i < cols; ++i) {
    unit[static_cast<size_t>(i)] = 1;
    h.add(unit.data(), 1);
    unit[static_cast<size_t>(i)] = 0;
  }
  auto u = gptq_inverse_factor(h, 0.01);
  ASSERT_TRUE(u.ok());
  ThreadPool pool(2);
  for (DType t : kBlockTypes) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<uint8_t> gptq = gptq_quantize_blocks(t, w.data(), rows, cols, *u, &pool);
    const int64_t row_bytes = cols / dtype_traits(t).block_elems * dtype_traits(t).block_bytes;
    std::vector<uint8_t> rtn(static_cast<size_t>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, w.data() + r * cols, rtn.data() + r * row_bytes, cols);
    if (t != DType::kQ8_0 && t != DType::kQ4_0) {
      EXPECT_EQ(gptq, rtn);
    } else {
      const std::vector<float> g = decode_rows(t, gptq, rows, cols), n = decode_rows(t, rtn, rows, cols);
      int differ = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        EXPECT_LE(std::fabs(g[i] - w[i]), std::fabs(n[i] - w[i]) + 1e-6f) << i;
        differ += g[i] != n[i];
      }
      EXPECT_LT(differ, static_cast<int>(w.size()) / 50);
    }
  }
  // Integer groups: the same scales, and codes round-to-nearest-even as the quantizer's.
  for (int bits : {4, 8}) {
    std::vector<int8_t> codes(w.size()), want_codes(w.size());
    std::vector<float> scales(static_cast<size_t>(rows * cols / 128)), want_scales(scales.size());
    gptq_quantize_int(w.data(), rows, cols, bits, 128, *u, codes.data(), scales.data(), &pool);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_weight_row_symmetric(w.data() + r * cols, cols, bits, 128, want_codes.data() + r * cols,
                                    want_scales.data() + r * cols / 128);
    }
    EXPECT_EQ(codes, want_codes) << bits;
    EXPECT_EQ(scales, want_scales) << bits;
  }
}

// Inputs whose channels are correlated (mixtures of a few sources, some channels large): the
// output error sum over tokens of ||(W - Q) x||^2, in double, against round-to-nearest's.
TEST(Gptq, LowersTheOutputErrorOnCorrelatedInputs) {
  const int64_t rows = 16, cols = 256, tokens = 512, sources = 24;
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  std::vector<float> mix(static_cast<size_t>(cols * sources));
  for (float& v : mix) v = dist(rng);
  std::vector<float> x(static_cast<size_t>(tokens * cols));
  for (int64_t t = 0; t < tokens; ++t) {
    std::vector<float> z(static_cast<size_t>(sources));
    for (float& v : z) v = dist(rng);
    for (int64_t c = 0; c < cols; ++c) {
      double s = 0.1 * dist(rng);
      for (int64_t j = 0; j < sources; ++j) s += mix[static_cast<size_t>(c * sources + j)] * z[static_cast<size_t>(j)];
      x[static_cast<size_t>(t * cols + c)] = static_cast<float>(s * (c % 37 == 0 ? 8 : 1));
    }
  }
  std::vector<float> w(static_cast<size_t>(rows * cols));
  for (float& v : w) v = dist(rng);
  GptqHessian h(cols);
  h.add(x.data(), tokens);
  ThreadPool pool(2);
  auto u = gptq_inverse_factor(h, 0.01, &pool);
  ASSERT_TRUE(u.ok());
  auto serial = gptq_inverse_factor(h, 0.01);
  ASSERT_TRUE(serial.ok());
  EXPECT_EQ(*u, *serial);  // the columns of the inverse do not depend on which thread solved them
  auto output_error = [&](const std::vector<float>& q) {
    double sum = 0;
    for (int64_t t = 0; t < tokens; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        double d = 0;
        for (int64_t c = 0; c < cols; ++c) {
          d += (static_cast<double>(w[static_cast<size_t>(r * cols + c)]) - q[static_cast<size_t>(r * cols + c)]) *
               x[static_cast<size_t>(t * cols + c)];
        }
        sum += d * d;
      }
    }
    return sum;
  };
  for (DType t : kBlockTypes) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t row_bytes = cols / dtype_traits(t).block_elems * dtype_traits(t).block_bytes;
    std::vector<uint8_t> rtn(static_cast<size_t>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, w.data() + r * cols, rtn.data() + r * row_bytes, cols);
    const double e_rtn = output_error(decode_rows(t, rtn, rows, cols));
    const double e_gptq = output_error(decode_rows(t, gptq_quantize_blocks(t, w.data(), rows, cols, *u, &pool), rows, cols));
    EXPECT_LT(e_gptq, 0.2 * e_rtn) << "round-to-nearest " << e_rtn << ", GPTQ " << e_gptq;
  }
  for (int bits : {4, 8}) {
    for (int64_t group : {int64_t{32}, cols}) {
      std::vector<int8_t> codes(w.size());
      std::vector<float> scales(static_cast<size_t>(rows * cols / group));
      auto values = [&] {
        std::vector<float> v(w.size());
        for (size_t i = 0; i < w.size(); ++i) v[i] = codes[i] * scales[i / static_cast<size_t>(group)];
        return v;
      };
      for (int64_t r = 0; r < rows; ++r) {
        quantize_weight_row_symmetric(w.data() + r * cols, cols, bits, group, codes.data() + r * cols,
                                      scales.data() + r * cols / group);
      }
      const double e_rtn = output_error(values());
      gptq_quantize_int(w.data(), rows, cols, bits, group, *u, codes.data(), scales.data(), &pool);
      const double e_gptq = output_error(values());
      EXPECT_LT(e_gptq, 0.2 * e_rtn) << bits << " bits, groups of " << group << ": round-to-nearest " << e_rtn
                                     << ", GPTQ " << e_gptq;
    }
  }
}

}  // namespace
}  // namespace pagoda
