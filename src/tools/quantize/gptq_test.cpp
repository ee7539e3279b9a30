// GPTQ: its factor and one sweep worked out by hand, round-to-nearest where the inputs are
// uncorrelated (byte for byte against the types' quantizers where those choose the scales; the
// searched scales against a brute-force search in double), a sweep in act-order equal to the
// stored-order sweep of the permuted matrix, and a lower output error than round-to-nearest on
// correlated inputs, measured in double here, for every GGUF block type and the int4 / int8
// groups.
#include "tools/quantize/gptq.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "tensor/convert.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace pagoda {
namespace {

// Rounds to integers: the grid of the hand-worked example.
class IntegerRounder final : public GptqGroupRounder {
 public:
  void begin(int64_t, int64_t, const float*, const double*) override {}
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

// The scale search, against a brute force in double: every scale from amax / (4 * hi) to 2 *
// amax / hi in 20,000 steps, its codes rounded to nearest and clamped. The search must never do
// worse than the round-to-nearest scale it is given, and come within 1% of the best error found
// there for 4 and 5 bits (it may beat it: the brute force is a grid too); for 8 bits, whose error
// has a local minimum every code or so where the search samples every 1.27 codes, within 25%
// (at most 21% over these trials).
TEST(Gptq, GroupScaleSearchNearsTheBestScale) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist;
  std::uniform_real_distribution<double> weight(0.1, 4.0);
  auto error = [](const std::vector<float>& v, const std::vector<double>& imp, int lo, int hi, double s) {
    double e = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double q = std::clamp(std::nearbyint(v[i] / s), static_cast<double>(lo), static_cast<double>(hi));
      e += imp[i] * (v[i] - s * q) * (v[i] - s * q);
    }
    return e;
  };
  struct Range {
    int lo, hi;
  };
  for (const Range range : {Range{-8, 7}, Range{-16, 15}, Range{-127, 127}}) {
    for (int trial = 0; trial < 20; ++trial) {
      const int64_t n = trial % 2 == 0 ? 32 : 64;
      std::vector<float> v(static_cast<size_t>(n));
      std::vector<double> imp(static_cast<size_t>(n));
      for (float& x : v) x = dist(rng) * (trial % 3 == 0 ? 1.0f : 0.02f);
      if (trial % 4 == 1) v[3] *= 6;  // an outlier, which the best scale may clip
      for (double& x : imp) x = trial % 5 == 0 ? 1.0 : weight(rng);
      float amax = 0;
      for (float x : v) amax = std::max(amax, std::fabs(x));
      const float rtn = amax / static_cast<float>(range.hi);
      const float s = gptq_group_scale(v.data(), imp.data(), n, range.lo, range.hi, rtn, false, false);
      ASSERT_GT(s, 0.0f);
      double best = error(v, imp, range.lo, range.hi, rtn);
      for (int step = 0; step <= 20000; ++step) {
        const double b = amax / (4.0 * range.hi) + step * (2.0 * amax / range.hi - amax / (4.0 * range.hi)) / 20000;
        best = std::min(best, error(v, imp, range.lo, range.hi, b));
      }
      const double got = error(v, imp, range.lo, range.hi, s);
      EXPECT_LE(got, error(v, imp, range.lo, range.hi, rtn)) << "range " << range.hi << ", trial " << trial;
      EXPECT_LE(got, (range.hi < 100 ? 1.01 : 1.25) * best) << "range " << range.hi << ", trial " << trial;
    }
  }
  // A worked case: values {1, 2, 3, 8}, codes [-8, 7], equal weights. Round-to-nearest's scale
  // 8/7 gives codes {1, 2, 3, 7} and error (1/7)^2 + (2/7)^2 + (3/7)^2 = 14/49 = 0.2857. The
  // least-squares scale of those codes is (1 + 4 + 9 + 56) / (1 + 4 + 9 + 49) = 70/63, with the
  // same codes and error (1/9)^2 + (2/9)^2 + (3/9)^2 + (2/9)^2 = 18/81 = 0.2222.
  const float four[] = {1, 2, 3, 8};
  const double ones[] = {1, 1, 1, 1};
  const float s = gptq_group_scale(four, ones, 4, -8, 7, 8.0f / 7.0f, false, false);
  double e = 0;
  for (float x : four) {
    const double d = x - s * std::clamp(std::nearbyint(x / s), -8.0f, 7.0f);
    e += d * d;
  }
  EXPECT_LE(e, 0.2223);
  // A negative scale, where allowed, reaches -8 with the largest value: 8 = -1 * -8 exactly, and 1,
  // 2, 3 exactly too (codes -1, -2, -3): error 0.
  EXPECT_EQ(gptq_group_scale(four, ones, 4, -8, 7, 8.0f / 7.0f, true, true), -1.0f);
  const float zeros[] = {0, 0};
  EXPECT_EQ(gptq_group_scale(zeros, ones, 2, -8, 7, 0.0f, false, false), 0.0f);
}

// The scale and offset of Q4_1 / Q5_1 groups, against a brute force in double over a grid of (d,
// m): never worse than the quantizer's, and near the grid's best (the search stores f16 and
// the grid is a grid, so either may win by a little).
TEST(Gptq, GroupAffineSearchNearsTheBest) {
  std::mt19937 rng(9);
  std::normal_distribution<float> dist;
  std::uniform_real_distribution<double> weight(0.1, 4.0);
  auto error = [](const std::vector<float>& v, const std::vector<double>& imp, int hi, double d, double m) {
    double e = 0;
    for (size_t i = 0; i < v.size(); ++i) {
      const double q = d != 0 ? std::clamp(std::nearbyint((v[i] - m) / d), 0.0, static_cast<double>(hi)) : 0.0;
      e += imp[i] * (v[i] - d * q - m) * (v[i] - d * q - m);
    }
    return e;
  };
  double worst = 0;
  for (const int hi : {15, 31}) {
    for (int trial = 0; trial < 10; ++trial) {
      const int64_t n = 32;
      std::vector<float> v(static_cast<size_t>(n));
      std::vector<double> imp(static_cast<size_t>(n));
      for (float& x : v) x = dist(rng) * 0.05f + (trial % 3 == 0 ? 0.03f : 0.0f);
      if (trial % 4 == 1) v[5] *= 6;  // an outlier
      for (double& x : imp) x = trial % 5 == 0 ? 1.0 : weight(rng);
      const float lo_v = *std::min_element(v.begin(), v.end()), hi_v = *std::max_element(v.begin(), v.end());
      const AffineScale rtn{fp16_to_f32(f32_to_fp16((hi_v - lo_v) / static_cast<float>(hi))), fp16_to_f32(f32_to_fp16(lo_v))};
      const AffineScale got = gptq_group_affine(v.data(), imp.data(), n, hi, rtn);
      EXPECT_EQ(got.d, fp16_to_f32(f32_to_fp16(got.d)));  // as f16 stores them
      EXPECT_EQ(got.m, fp16_to_f32(f32_to_fp16(got.m)));
      const double range = hi_v - lo_v;
      double best = error(v, imp, hi, rtn.d, rtn.m);
      for (int a = 0; a <= 150; ++a) {
        const double d = range / hi * (0.5 + a / 100.0);
        for (int b = -75; b <= 75; ++b) best = std::min(best, error(v, imp, hi, d, lo_v + range * b / 300.0));
      }
      const double e = error(v, imp, hi, got.d, got.m);
      EXPECT_LE(e, error(v, imp, hi, rtn.d, rtn.m)) << "hi " << hi << ", trial " << trial;
      EXPECT_LE(e, 1.03 * best) << "hi " << hi << ", trial " << trial;  // at most 1.011 measured
      worst = std::max(worst, e / best);
    }
  }
  std::printf("the search's error at most %.3f x the grid's best\n", worst);
  // A worked case: {0, 1, 2, 4} on codes [0, 3]. The quantizer's d = 4/3, m = 0 gives codes {0,
  // 1, 2, 3} (1.5 rounds to even) and error (1/3)^2 + (2/3)^2 = 5/9. The least-squares line through
  // (q, v) = (0, 0), (1, 1), (2, 2), (3, 4) is d = 1.3, m = -0.2 (residuals 0.2, -0.1, -0.4, 0.3:
  // error 0.30), whose nearest codes are the same four.
  const float four[] = {0, 1, 2, 4};
  const double ones[] = {1, 1, 1, 1};
  const AffineScale s = gptq_group_affine(four, ones, 4, 3, {4.0f / 3, 0.0f});
  double e = 0;
  for (float x : four) {
    const double d = x - s.d * std::clamp(std::nearbyint((x - s.m) / s.d), 0.0f, 3.0f) - s.m;
    e += d * d;
  }
  EXPECT_NEAR(e, 0.30, 1e-3);
  EXPECT_NEAR(s.d, 1.3, 1e-3);
  EXPECT_NEAR(s.m, -0.2, 1e-3);
}

// A Hessian whose diagonal is `diag` (unit vectors, each added diag[i] times) and nothing else.
GptqHessian diagonal_hessian(const std::vector<int>& diag) {
  GptqHessian h(static_cast<int64_t>(diag.size()));
  std::vector<float> unit(diag.size(), 0.0f);
  for (size_t i = 0; i < diag.size(); ++i) {
    unit[i] = 1;
    for (int t = 0; t < diag[i]; ++t) h.add(unit.data(), 1);
    unit[i] = 0;
  }
  return h;
}

TEST(Gptq, ActOrderTakesGroupsThenColumnsByTheirInputs) {
  // Diagonal {1, 5, 4, 3}: in groups of 2 the sums are 6 and 7, so group 1 (columns 2, 3) goes
  // first, then group 0 with its column 1 (5) before column 0 (1). Freely: 1, 2, 3, 0.
  const GptqHessian h = diagonal_hessian({1, 5, 4, 3});
  EXPECT_EQ(gptq_act_order(h, 2), (std::vector<int64_t>{2, 3, 1, 0}));
  EXPECT_EQ(gptq_act_order(h, 4), (std::vector<int64_t>{1, 2, 3, 0}));
  EXPECT_EQ(gptq_act_order(diagonal_hessian({2, 2, 2, 2}), 2), (std::vector<int64_t>{0, 1, 2, 3}));  // ties: stored
}

// A sweep in an order is the stored-order sweep of the matrix with its columns (and H's rows and
// columns) so permuted: the factor, and the codes, scales and blocks once put back.
TEST(Gptq, SweepInOrderIsTheSweepOfThePermutedMatrix) {
  const int64_t rows = 12, cols = 64, tokens = 96;
  std::mt19937 rng(13);
  std::normal_distribution<float> dist;
  std::vector<float> x(static_cast<size_t>(tokens * cols)), w(static_cast<size_t>(rows * cols));
  for (int64_t t = 0; t < tokens; ++t) {
    const float common = dist(rng);
    for (int64_t c = 0; c < cols; ++c) x[static_cast<size_t>(t * cols + c)] = dist(rng) * (1 + c % 7) + common;
  }
  for (float& v : w) v = dist(rng);
  GptqHessian h(cols);
  h.add(x.data(), tokens);
  auto permuted = [&](const std::vector<int64_t>& order, const std::vector<float>& m, int64_t m_rows) {
    std::vector<float> out(m.size());
    for (int64_t r = 0; r < m_rows; ++r) {
      for (int64_t p = 0; p < cols; ++p) out[static_cast<size_t>(r * cols + p)] = m[static_cast<size_t>(r * cols + order[static_cast<size_t>(p)])];
    }
    return out;
  };
  ThreadPool pool(2);
  // Free order (one group per row): int4 codes, each put back in its stored column.
  {
    const std::vector<int64_t> order = gptq_act_order(h, cols);
    ASSERT_NE(order[0], 0);  // not the stored order
    GptqHessian hp(cols);
    hp.add(permuted(order, x, tokens).data(), tokens);
    auto u = gptq_inverse_factor(h, 0.01, &pool, order);
    auto up = gptq_inverse_factor(hp, 0.01, &pool);
    ASSERT_TRUE(u.ok() && up.ok());
    EXPECT_EQ(*u, *up);
    std::vector<int8_t> codes(w.size()), codes_p(w.size());
    std::vector<float> scales(rows), scales_p(rows);
    gptq_quantize_int(w.data(), rows, cols, 4, cols, *u, codes.data(), scales.data(), &pool, order);
    const std::vector<float> wp = permuted(order, w, rows);
    gptq_quantize_int(wp.data(), rows, cols, 4, cols, *up, codes_p.data(), scales_p.data(), &pool);
    EXPECT_EQ(scales, scales_p);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t p = 0; p < cols; ++p) {
        ASSERT_EQ(codes[static_cast<size_t>(r * cols + order[static_cast<size_t>(p)])], codes_p[static_cast<size_t>(r * cols + p)])
            << r << ", " << p;
      }
    }
  }
  // Whole blocks moved (the last first), each in its stored order: Q4_0 blocks put back.
  {
    std::vector<int64_t> order;
    for (int64_t b = cols / 32 - 1; b >= 0; --b) {
      for (int64_t e = 0; e < 32; ++e) order.push_back(b * 32 + e);
    }
    GptqHessian hp(cols);
    hp.add(permuted(order, x, tokens).data(), tokens);
    auto u = gptq_inverse_factor(h, 0.01, &pool, order);
    auto up = gptq_inverse_factor(hp, 0.01, &pool);
    ASSERT_TRUE(u.ok() && up.ok());
    const std::vector<uint8_t> got = gptq_quantize_blocks(DType::kQ4_0, w.data(), rows, cols, *u, &pool, order);
    const std::vector<float> wp = permuted(order, w, rows);
    const std::vector<uint8_t> want_p = gptq_quantize_blocks(DType::kQ4_0, wp.data(), rows, cols, *up, &pool);
    const int64_t bb = dtype_traits(DType::kQ4_0).block_bytes, blocks = cols / 32;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* a = got.data() + (r * blocks + (blocks - 1 - b)) * bb;
        const uint8_t* want = want_p.data() + (r * blocks + b) * bb;
        EXPECT_TRUE(std::equal(a, a + bb, want)) << "row " << r << ", block " << b;
      }
    }
  }
}

// Uncorrelated inputs (H = I): no error is spread, and each element goes to the nearest value of
// its block's grid. Where the type's quantizer chooses the scales (the K-quants, which round
// against their stored scales), GPTQ's bytes are the quantizer's; where GPTQ searches the scale
// (Q8_0, Q4_0, Q5_0, the integer groups) or the scale and offset (Q4_1, Q5_1), each element is on
// the nearest code of them and each group's squared error is at most round-to-nearest's.
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
  // Each group of `group` values of `got` is on the nearest code (in [lo, hi]) of scales[g] and no
  // farther from w in total than `rtn`'s.
  // offsets: Q4_1 / Q5_1's m per group (value = d * code + m), else empty.
  auto check_groups = [&](const std::vector<float>& got, const std::vector<float>& rtn, int64_t group,
                          const std::vector<float>& scales, int lo, int hi, const std::vector<float>& offsets) {
    for (size_t g = 0; g < scales.size(); ++g) {
      double e_got = 0, e_rtn = 0;
      for (size_t i = g * static_cast<size_t>(group); i < (g + 1) * static_cast<size_t>(group); ++i) {
        const float s = scales[g], m = offsets.empty() ? 0.0f : offsets[g];
        const float code = std::clamp(std::nearbyint((w[i] - m) / s), static_cast<float>(lo), static_cast<float>(hi));
        const float nearest = offsets.empty() ? s * code : s * code + m;
        EXPECT_EQ(got[i], nearest) << "element " << i;
        e_got += (static_cast<double>(got[i]) - w[i]) * (static_cast<double>(got[i]) - w[i]);
        e_rtn += (static_cast<double>(rtn[i]) - w[i]) * (static_cast<double>(rtn[i]) - w[i]);
      }
      EXPECT_LE(e_got, e_rtn * (1 + 1e-9)) << "group " << g;
    }
  };
  for (DType t : kBlockTypes) {
    SCOPED_TRACE(dtype_name(t));
    const std::vector<uint8_t> gptq = gptq_quantize_blocks(t, w.data(), rows, cols, *u, &pool);
    const int64_t row_bytes = cols / dtype_traits(t).block_elems * dtype_traits(t).block_bytes;
    std::vector<uint8_t> rtn(static_cast<size_t>(rows * row_bytes));
    for (int64_t r = 0; r < rows; ++r) quantize_row(t, w.data() + r * cols, rtn.data() + r * row_bytes, cols);
    const bool affine = t == DType::kQ4_1 || t == DType::kQ5_1;
    if (t != DType::kQ8_0 && t != DType::kQ4_0 && t != DType::kQ5_0 && !affine) {
      EXPECT_EQ(gptq, rtn);
      continue;
    }
    const int64_t block_bytes = dtype_traits(t).block_bytes;
    std::vector<float> scales, offsets;  // the f16 d at the start of each block (and Q4_1 / Q5_1's m after it)
    for (size_t b = 0; b < gptq.size(); b += static_cast<size_t>(block_bytes)) {
      scales.push_back(fp16_to_f32(static_cast<uint16_t>(gptq[b] | gptq[b + 1] << 8)));
      offsets.push_back(affine ? fp16_to_f32(static_cast<uint16_t>(gptq[b + 2] | gptq[b + 3] << 8)) : 0.0f);
    }
    const int hi = t == DType::kQ8_0 ? 127 : t == DType::kQ4_0 ? 7 : t == DType::kQ5_0 ? 15 : t == DType::kQ4_1 ? 15 : 31;
    check_groups(decode_rows(t, gptq, rows, cols), decode_rows(t, rtn, rows, cols), kQuantBlock, scales,
                 affine ? 0 : -hi - 1, hi, offsets);
  }
  for (int bits : {4, 8}) {
    SCOPED_TRACE(bits);
    std::vector<int8_t> codes(w.size()), rtn_codes(w.size());
    std::vector<float> scales(static_cast<size_t>(rows * cols / 128)), rtn_scales(scales.size());
    gptq_quantize_int(w.data(), rows, cols, bits, 128, *u, codes.data(), scales.data(), &pool);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_weight_row_symmetric(w.data() + r * cols, cols, bits, 128, rtn_codes.data() + r * cols,
                                    rtn_scales.data() + r * cols / 128);
    }
    std::vector<float> got(w.size()), rtn(w.size());
    for (size_t i = 0; i < w.size(); ++i) {
      got[i] = codes[i] * scales[i / 128];
      rtn[i] = rtn_codes[i] * rtn_scales[i / 128];
    }
    check_groups(got, rtn, 128, scales, bits == 4 ? -8 : -127, bits == 4 ? 7 : 127, {});
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
    const std::vector<int64_t> order = gptq_act_order(h, dtype_traits(t).block_elems);
    auto u_order = gptq_inverse_factor(h, 0.01, &pool, order);
    ASSERT_TRUE(u_order.ok());
    const double e_act_order =
        output_error(decode_rows(t, gptq_quantize_blocks(t, w.data(), rows, cols, *u_order, &pool, order), rows, cols));
    EXPECT_LT(e_act_order, 0.2 * e_rtn) << "round-to-nearest " << e_rtn << ", GPTQ in act-order " << e_act_order;
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
