#include "tensor/half.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tensor/dtype.h"

namespace pagoda {
namespace {

// Every finite fp16 value round-trips exactly through f32.
TEST(Half, AllFp16ValuesRoundTrip) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    uint16_t v = static_cast<uint16_t>(h);
    float f = fp16_to_f32(v);
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_fp16(f), v) << std::hex << h;
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(fp16_to_f32(0x3c00), 1.0f);
  EXPECT_EQ(fp16_to_f32(0xc000), -2.0f);
  EXPECT_EQ(fp16_to_f32(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(fp16_to_f32(0x7bff), 65504.0f);
  EXPECT_EQ(f32_to_fp16(1e6f), 0x7c00);                  // overflow to +inf
  EXPECT_EQ(f32_to_fp16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie rounds to even
  EXPECT_EQ(bf16_to_f32(0x3f80), 1.0f);
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(3.140625f), 0x4049);
}

TEST(DType, Geometry) {
  EXPECT_EQ(*dtype_bytes(DType::kQ8_0, 64), 68u);
  EXPECT_EQ(*dtype_bytes(DType::kQ4_0, 32), 18u);
  EXPECT_FALSE(dtype_bytes(DType::kQ4_0, 33).has_value());
  EXPECT_FALSE(dtype_bytes(DType::kF32, ~0ull / 2).has_value());
  EXPECT_EQ(dtype_from_name("bf16"), DType::kBF16);
  EXPECT_EQ(dtype_from_name("q5_k"), DType::kQ5_K);
  EXPECT_EQ(*dtype_bytes(DType::kQ6_K, 512), 420u);
  EXPECT_FALSE(dtype_bytes(DType::kQ4_K, 32).has_value());  // not a whole super-block
  EXPECT_FALSE(dtype_from_name("q4_k_m").has_value());
}

}  // namespace
}  // namespace pagoda
