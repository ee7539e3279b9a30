// The fp8 formats against their definitions: values worked by hand, E5M2 against the top byte of
// an fp16 for every code, every finite code surviving a round trip, and encoding against a
// brute-force search for the nearest code (ties to the even code) on many values.
#include "tensor/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tensor/half.h"

namespace pagoda {
namespace {

TEST(Fp8, E4M3ValuesByHand) {
  EXPECT_EQ(fp8_e4m3_to_f32(0x00), 0.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x38), 1.0f);                  // 0.0111.000: 2^(7-7)
  EXPECT_EQ(fp8_e4m3_to_f32(0x3C), 1.5f);                  // mantissa 100: 1 + 4/8
  EXPECT_EQ(fp8_e4m3_to_f32(0x7E), 448.0f);                // 0.1111.110: 1.75 * 2^8, the largest
  EXPECT_EQ(fp8_e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal: 1/8 * 2^-6
  EXPECT_EQ(fp8_e4m3_to_f32(0x07), std::ldexp(7.0f, -9));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7F)));          // no infinities: S.1111.111 is NaN
  EXPECT_EQ(fp8_e4m3_to_f32(0x78), 256.0f);                // 0.1111.000 is a number here
}

TEST(Fp8, E5M2ValuesByHandAndTheTopByteOfFp16) {
  EXPECT_EQ(fp8_e5m2_to_f32(0x3C), 1.0f);                  // 0.01111.00
  EXPECT_EQ(fp8_e5m2_to_f32(0x7B), 57344.0f);              // 0.11110.11: 1.75 * 2^15
  EXPECT_TRUE(std::isinf(fp8_e5m2_to_f32(0x7C)));
  EXPECT_TRUE(std::isnan(fp8_e5m2_to_f32(0x7D)));
  EXPECT_EQ(fp8_e5m2_to_f32(0x01), std::ldexp(1.0f, -16));  // 1/4 * 2^-14
  for (int v = 0; v < 256; ++v) {
    const float want = fp16_to_f32(static_cast<uint16_t>(v << 8));
    const float got = fp8_e5m2_to_f32(static_cast<uint8_t>(v));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << v;
    } else {
      EXPECT_EQ(got, want) << v;
    }
  }
}

// The code whose value is nearest to x (ties: the even code), over the finite codes, saturating.
uint8_t nearest(float (*decode)(uint8_t), float x, float max) {
  const float a = std::fmin(std::fabs(x), max);
  int best = -1;
  double best_err = 0;
  for (int v = 0; v < 128; ++v) {
    const float d = decode(static_cast<uint8_t>(v));
    if (!std::isfinite(d)) continue;
    const double err = std::fabs(static_cast<double>(d) - a);
    if (best < 0 || err < best_err || (err == best_err && v % 2 == 0)) {
      best = v;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

TEST(Fp8, EncodingRoundsToTheNearestCode) {
  struct Format {
    float (*decode)(uint8_t);
    uint8_t (*encode)(float);
    float max;
  };
  for (const Format f : {Format{fp8_e4m3_to_f32, f32_to_fp8_e4m3, kFp8E4M3Max},
                         Format{fp8_e5m2_to_f32, f32_to_fp8_e5m2, kFp8E5M2Max}}) {
    // Every finite code comes back as itself.
    for (int v = 0; v < 256; ++v) {
      const float d = f.decode(static_cast<uint8_t>(v));
      if (std::isfinite(d)) {
        EXPECT_EQ(f.encode(d), v) << v << " = " << d;
      }
    }
    // Midpoints between neighbours (exact ties), and random values over the whole range.
    for (int v = 0; v < 127; ++v) {
      const float lo = f.decode(static_cast<uint8_t>(v)), hi = f.decode(static_cast<uint8_t>(v + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const float mid = (lo + hi) / 2;
      EXPECT_EQ(f.encode(mid), v % 2 == 0 ? v : v + 1) << "tie between " << lo << " and " << hi;
      EXPECT_EQ(f.encode(-mid), (v % 2 == 0 ? v : v + 1) | 0x80);
    }
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> exponent(-20.0f, 18.0f);
    for (int i = 0; i < 20000; ++i) {
      const float x = (rng() % 2 ? 1.0f : -1.0f) * std::exp2(exponent(rng));
      ASSERT_EQ(f.encode(x), nearest(f.decode, x, f.max)) << x;
    }
    // Saturation, infinities, NaN.
    EXPECT_EQ(f.decode(f.encode(1e30f)), f.max);
    EXPECT_EQ(f.decode(f.encode(-INFINITY)), -f.max);
    EXPECT_TRUE(std::isnan(f.decode(f.encode(NAN))));
  }
}

}  // namespace
}  // namespace pagoda
