// Checks the reference kernels against plain double-precision math written here, and the
// Q8_0/Q4_0 conversions against a byte-level reading of the GGUF block format.
#include "backend/cpu/scalar/reference_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kv_rows.h"
#include "tensor/convert.h"
#include "tensor/quant_blocks.h"
#include "support/random_values.h"

namespace pagoda::cpu {
namespace {

// fp16 decoded from its bit fields, independently of tensor/half.h.
double fp16_bits_to_double(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v = exp == 0 ? std::ldexp(mant, -24) : std::ldexp(1024 + mant, exp - 25);
  return sign ? -v : v;
}

using testing::random_floats;

TEST(Dequantize, Q8_0MatchesBlockFormat) {
  std::mt19937 rng(1);
  std::vector<uint8_t> bytes(34 * 3);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  for (int blk = 0; blk < 3; ++blk) bytes[blk * 34 + 1] &= 0x3b;  // keep scales finite
  std::vector<float> got(96);
  dequantize_row(DType::kQ8_0, bytes.data(), got.data(), 96);
  for (int blk = 0; blk < 3; ++blk) {
    const uint8_t* b = bytes.data() + blk * 34;
    double d = fp16_bits_to_double(static_cast<uint16_t>(b[0] | b[1] << 8));
    for (int j = 0; j < 32; ++j) {
      double want = d * static_cast<int8_t>(b[2 + j]);
      EXPECT_EQ(got[blk * 32 + j], static_cast<float>(want)) << blk << " " << j;
    }
  }
}

TEST(Dequantize, Q4_0MatchesBlockFormat) {
  std::mt19937 rng(2);
  std::vector<uint8_t> bytes(18 * 4);
  for (auto& b : bytes) b = static_cast<uint8_t>(rng());
  for (int blk = 0; blk < 4; ++blk) bytes[blk * 18 + 1] &= 0x3b;
  std::vector<float> got(128);
  dequantize_row(DType::kQ4_0, bytes.data(), got.data(), 128);
  for (int blk = 0; blk < 4; ++blk) {
    const uint8_t* b = bytes.data() + blk * 18;
    double d = fp16_bits_to_double(static_cast<uint16_t>(b[0] | b[1] << 8));
    for (int j = 0; j < 32; ++j) {
      int nibble = j < 16 ? (b[2 + j] & 15) : (b[2 + j - 16] >> 4);
      EXPECT_EQ(got[blk * 32 + j], static_cast<float>(d * (nibble - 8))) << blk << " " << j;
    }
  }
}

TEST(Quantize, RoundTripErrorWithinHalfStep) {
  auto x = random_floats(256, 3);
  for (DType t : {DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    std::vector<uint8_t> q(*dtype_bytes(t, 256));
    std::vector<float> back(256);
    quantize_row(t, x.data(), q.data(), 256);
    dequantize_row(t, q.data(), back.data(), 256);
    double tol = t == DType::kQ4_0 ? 1.0 / 8 + 1e-3 : t == DType::kQ8_0 ? 0.5 / 127 + 1e-3 : 1e-2;
    for (int i = 0; i < 256; ++i) EXPECT_NEAR(back[i], x[i], tol) << dtype_name(t) << " " << i;
  }
}

// Every type of the traits table, K-quants included (rows of one super-block).
TEST(Matmul, AllWeightTypesMatchDoubleReference) {
  const Kernels k = cpu_kernels(reference_kernels());
  const int64_t m = 3, n = 5, kdim = 256;
  auto x = random_floats(m * kdim, 4);
  auto wf = random_floats(n * kdim, 5, 0.5f);
  for (const DTypeTraits& traits : all_dtypes()) {
    if (!traits.dense_matmul) continue;
    const DType t = traits.type;
    std::vector<uint8_t> wbytes(*dtype_bytes(t, n * kdim));
    for (int64_t r = 0; r < n; ++r) {
      quantize_row(t, wf.data() + r * kdim, wbytes.data() + r * (wbytes.size() / n), kdim);
    }
    Tensor w(wbytes.data(), t, {n, kdim});
    std::vector<float> y(m * n);
    k.matmul(x.data(), m, w, y.data());
    // Quantized weights multiply activations quantized to BlockQ8Act: the same product with x
    // replaced by d * q per 32-element block.
    std::vector<double> xs(x.begin(), x.end());
    if (is_quantized(t)) {
      std::vector<BlockQ8Act> xq(static_cast<size_t>(m * kdim / 32));
      for (int64_t i = 0; i < m; ++i) quantize_activation_row(&x[i * kdim], &xq[i * kdim / 32], kdim);
      for (int64_t e = 0; e < m * kdim; ++e)
        xs[e] = static_cast<double>(xq[e / 32].d) * xq[e / 32].qs[e % 32];
    }
    std::vector<float> row(kdim);
    for (int64_t j = 0; j < n; ++j) {
      dequantize_row(t, w.row(j), row.data(), kdim);
      for (int64_t i = 0; i < m; ++i) {
        double want = 0;
        for (int64_t c = 0; c < kdim; ++c) want += xs[i * kdim + c] * row[c];
        EXPECT_NEAR(y[i * n + j], want, 1e-4) << dtype_name(t);
      }
    }
  }
}

// matmul_int against the float64 product of the dequantized codes with the activations as
// quantized per token (|error| only from f32 rounding): int8 per channel and int4 in groups of 32,
// without and with zero points (the weight scale * (code - zero)),
// with a case worked by hand first.
TEST(MatmulInt, MatchesDoubleReferenceOfItsDefinition) {
  const Kernels kern = cpu_kernels(reference_kernels());
  {
    // x = (1, -2, 0, 4): s = 4 / 127, codes round(x * 127 / 4) = (32, -64, 0, 127) (31.75 -> 32,
    // -63.5 -> -64 to even). w row 0: codes (1, 2, 3, 4), scale 0.5: y = 4/127 * 0.5 * (32 - 128 + 508).
    const int8_t codes[4] = {1, 2, 3, 4};
    const float scale = 0.5f, x[4] = {1, -2, 0, 4};
    IntWeight w;
    w.codes = codes;
    w.bits = 8;
    w.n = 1;
    w.k = 4;
    w.group_size = 4;
    w.scales = &scale;
    float y = 0;
    kern.matmul_int(x, 1, w, &y);
    EXPECT_FLOAT_EQ(y, 4.0f / 127 * 0.5f * (32 - 128 + 508));
    // Static scale 0.01: codes (100, -127 saturated from -200, 0, 127 saturated from 400).
    w.input_scale = 0.01f;
    kern.matmul_int(x, 1, w, &y);
    EXPECT_FLOAT_EQ(y, 0.01f * 0.5f * (100 - 254 + 508));
  }
  std::mt19937 rng(8);
  for (int pass = 0; pass < 4; ++pass) {  // int8, int4, then both with zero points
    const int bits = pass % 2 == 0 ? 8 : 4;
    const int64_t m = 3, n = 5, k = 96, group = bits == 8 ? k : 32, groups = k / group;
    std::vector<uint8_t> codes(static_cast<size_t>(n * (bits == 8 ? k : k / 2)));
    for (auto& c : codes) c = static_cast<uint8_t>(rng());
    std::vector<float> scales(static_cast<size_t>(n * groups));
    for (auto& s : scales) s = 0.001f * static_cast<float>(1 + rng() % 20);
    auto x = random_floats(m * k, 12);
    IntWeight w;
    w.codes = codes.data();
    w.bits = bits;
    w.n = n;
    w.k = k;
    w.group_size = group;
    w.scales = scales.data();
    std::vector<int32_t> zeros(static_cast<size_t>(n * groups), 0);
    if (pass >= 2) {
      for (auto& z : zeros) z = static_cast<int32_t>(rng() % 17) - 8;
      w.zero_points = zeros.data();
    }
    std::vector<float> y(static_cast<size_t>(m * n));
    kern.matmul_int(x.data(), m, w, y.data());
    for (int64_t i = 0; i < m; ++i) {
      double amax = 0;
      for (int64_t t = 0; t < k; ++t) amax = std::max(amax, std::fabs(double{x[static_cast<size_t>(i * k + t)]}));
      for (int64_t j = 0; j < n; ++j) {
        double want = 0, mag = 0;
        for (int64_t t = 0; t < k; ++t) {
          const double xq = std::nearbyint(double{x[static_cast<size_t>(i * k + t)]} * static_cast<double>(127.0f / static_cast<float>(amax)));
          const uint8_t* row = codes.data() + j * (bits == 8 ? k : k / 2);
          const int code = bits == 8 ? static_cast<int8_t>(row[t]) : int4_code(row, t);
          const size_t g = static_cast<size_t>(j * groups + t / group);
          const double term = static_cast<double>(amax / 127) * xq * (code - zeros[g]) * scales[g];
          want += term;
          mag += std::fabs(term);
        }
        EXPECT_NEAR(y[static_cast<size_t>(i * n + j)], want, 1e-5 * mag + 1e-9) << "bits " << bits << " y[" << i << ", " << j << "]";
      }
    }
  }
}

// BlockQ8Act by its definition: d = max|x| / 127, q = round-to-even(x * 127 / max|x|); so
// |x - d q| <= d / 2, the largest magnitude maps to +-127, and a zero block stays zero.
TEST(Quantize, ActivationBlocksFollowTheirDefinition) {
  auto x = random_floats(96, 6, 3.0f);
  for (int j = 32; j < 64; ++j) x[j] = 0;  // a zero block
  std::vector<BlockQ8Act> q(3);
  quantize_activation_row(x.data(), q.data(), 96);
  for (int b = 0; b < 3; ++b) {
    double amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(static_cast<double>(x[b * 32 + j])));
    EXPECT_EQ(q[b].d, static_cast<float>(amax) / 127.0f) << b;
    int max_q = 0;
    for (int j = 0; j < 32; ++j) {
      const double v = x[b * 32 + j];
      EXPECT_LE(std::fabs(v - static_cast<double>(q[b].d) * q[b].qs[j]), q[b].d * (0.5 + 1e-5)) << b << " " << j;
      max_q = std::max(max_q, std::abs(int{q[b].qs[j]}));
    }
    EXPECT_EQ(max_q, b == 1 ? 0 : 127) << b;
  }
}

TEST(Rope, BothLayoutsRotateTheirPairs) {
  const Kernels k = cpu_kernels(reference_kernels());
  const int64_t hd = 8, heads = 2;
  auto x = random_floats(hd * heads, 6);
  float inv_freq[4] = {1.0f, 0.1f, 0.01f, 0.001f};
  int32_t pos = 7;
  for (bool interleaved : {true, false}) {
    std::vector<float> y = x;
    k.rope(y.data(), 1, heads, hd, &pos, inv_freq, interleaved);
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < 4; ++i) {
        int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + 4;
        double ang = pos * static_cast<double>(inv_freq[i]);
        double x0 = x[h * hd + a], x1 = x[h * hd + b];
        EXPECT_NEAR(y[h * hd + a], x0 * std::cos(ang) - x1 * std::sin(ang), 1e-6);
        EXPECT_NEAR(y[h * hd + b], x0 * std::sin(ang) + x1 * std::cos(ang), 1e-6);
      }
    }
  }
}

// Paged attention over a shuffled block table equals dense causal attention computed here.
TEST(PagedAttention, MatchesDenseCausalAttentionWithGqaAndWindow) {
  const Kernels k = cpu_kernels(reference_kernels());
  const int64_t heads = 4, kv_heads = 2, hd = 8, block = 4, ctx = 11, nq = 3;
  KvLayerView cache{nullptr, nullptr, 6, block, kv_heads, hd};
  std::vector<float> kc(6 * block * kv_heads * hd), vc(kc.size());
  cache.key = kc.data();
  cache.value = vc.data();
  std::vector<BlockId> table = {4, 1, 5};  // logical block i -> physical block
  auto keys = random_floats(ctx * kv_heads * hd, 7);
  auto vals = random_floats(ctx * kv_heads * hd, 8);
  std::vector<int64_t> slots(ctx);
  for (int64_t t = 0; t < ctx; ++t) slots[t] = table[t / block] * block + t % block;
  k.store_kv(keys.data(), vals.data(), slots.data(), ctx, cache);
  auto q = random_floats(nq * heads * hd, 9);
  for (int64_t window : {0, 5}) {
    AttentionSeq seq{0, nq, ctx, table.data()};
    AttentionParams params{heads, kv_heads, hd, 0.35f, window};
    std::vector<float> out(nq * heads * hd);
    k.paged_attention(q.data(), &seq, 1, cache, params, out.data());
    for (int64_t j = 0; j < nq; ++j) {
      int64_t pos = ctx - nq + j;
      int64_t first = window ? std::max<int64_t>(0, pos - window + 1) : 0;
      for (int64_t h = 0; h < heads; ++h) {
        int64_t kvh = h / 2;
        std::vector<double> w;
        double mx = -1e300, sum = 0;
        for (int64_t t = first; t <= pos; ++t) {
          double d = 0;
          for (int64_t c = 0; c < hd; ++c) d += q[(j * heads + h) * hd + c] * keys[(t * kv_heads + kvh) * hd + c];
          w.push_back(d * 0.35);
          mx = std::max(mx, w.back());
        }
        for (auto& v : w) sum += (v = std::exp(v - mx));
        for (int64_t c = 0; c < hd; ++c) {
          double want = 0;
          for (int64_t t = first; t <= pos; ++t) want += w[t - first] / sum * vals[(t * kv_heads + kvh) * hd + c];
          EXPECT_NEAR(out[(j * heads + h) * hd + c], want, 1e-5) << "window " << window;
        }
      }
    }
  }
}

// store_kv into a cache of each dtype keeps every element within its format's rounding (relative
// 2^-11 f16, 2^-8 bf16, 2^-4 fp8 e4m3, 2^-3 fp8 e5m2 for normal values, half the smallest
// subnormal below them; int8: half a step of the row's scale), and the attention reads exactly
// what was stored (float64 attention over the rows read back agrees to f32 rounding).
TEST(PagedAttention, EveryCacheDtypeStoresWithinItsRoundingAndReadsWhatItStored) {
  const Kernels k = cpu_kernels(reference_kernels());
  const int64_t heads = 4, kv_heads = 2, hd = 8, block = 4, ctx = 9, blocks = 3;
  auto keys = random_floats(ctx * kv_heads * hd, 21);
  auto vals = random_floats(ctx * kv_heads * hd, 22);
  auto q = random_floats(heads * hd, 23);
  std::vector<BlockId> table = {2, 0, 1};
  std::vector<int64_t> slots(ctx);
  for (int64_t t = 0; t < ctx; ++t) slots[t] = table[t / block] * block + t % block;
  const struct {
    KvCacheDtype t;
    double rel, abs;
  } kTypes[] = {{KvCacheDtype::kF32, 0, 0},
                {KvCacheDtype::kF16, 1.0 / 2048, std::ldexp(1.0, -25)},
                {KvCacheDtype::kBF16, 1.0 / 256, 1e-38},
                {KvCacheDtype::kFp8E4M3, 1.0 / 16, std::ldexp(1.0, -10)},
                {KvCacheDtype::kFp8E5M2, 1.0 / 8, std::ldexp(1.0, -17)},
                {KvCacheDtype::kInt8, 0, 0}};
  for (const auto& [t, rel, abs] : kTypes) {
    const int64_t rows = blocks * block * kv_heads;
    std::vector<uint8_t> kc(static_cast<size_t>(rows * hd * kv_cache_elem_bytes(t))), vc(kc.size());
    std::vector<float> ks(static_cast<size_t>(rows)), vs(ks.size());
    KvLayerView cache{kc.data(), vc.data(), blocks, block, kv_heads, hd, t, ks.data(), vs.data()};
    k.store_kv(keys.data(), vals.data(), slots.data(), ctx, cache);
    std::vector<float> back_k(static_cast<size_t>(ctx * kv_heads * hd)), back_v(back_k.size());
    for (int64_t tok = 0; tok < ctx; ++tok) {
      for (int64_t h = 0; h < kv_heads; ++h) {
        const int64_t off = (tok * kv_heads + h) * hd;
        read_kv_row(cache, false, slots[tok], h, back_k.data() + off);
        read_kv_row(cache, true, slots[tok], h, back_v.data() + off);
        double amax = 0;
        for (int64_t d = 0; d < hd; ++d) amax = std::max(amax, std::fabs(double{keys[off + d]}));
        for (int64_t d = 0; d < hd; ++d) {
          const double x = keys[off + d], got = back_k[off + d];
          const double tol = t == KvCacheDtype::kInt8 ? amax / 127 / 2 * 1.0001 : std::max(rel * std::fabs(x), abs);
          EXPECT_NEAR(got, x, tol) << kv_cache_dtype_name(t) << " key " << tok << "/" << h << "/" << d;
        }
      }
    }
    AttentionSeq seq{0, 1, ctx, table.data()};
    AttentionParams params{heads, kv_heads, hd, 0.35f, 0};
    std::vector<float> out(heads * hd);
    k.paged_attention(q.data(), &seq, 1, cache, params, out.data());
    for (int64_t h = 0; h < heads; ++h) {
      const int64_t kvh = h / 2;
      std::vector<double> w;
      double mx = -1e300, sum = 0;
      for (int64_t tok = 0; tok < ctx; ++tok) {
        double d = 0;
        for (int64_t c = 0; c < hd; ++c) d += q[h * hd + c] * back_k[(tok * kv_heads + kvh) * hd + c];
        w.push_back(d * 0.35);
        mx = std::max(mx, w.back());
      }
      for (auto& v : w) sum += (v = std::exp(v - mx));
      for (int64_t c = 0; c < hd; ++c) {
        double want = 0;
        for (int64_t tok = 0; tok < ctx; ++tok) want += w[tok] / sum * back_v[(tok * kv_heads + kvh) * hd + c];
        EXPECT_NEAR(out[h * hd + c], want, 1e-5) << kv_cache_dtype_name(t);
      }
    }
  }
}

TEST(Elementwise, RmsNormSiluAdd) {
  const Kernels k = cpu_kernels(reference_kernels());
  auto x = random_floats(2 * 16, 10);
  auto w = random_floats(16, 11);
  std::vector<float> y(32);
  k.rms_norm(x.data(), w.data(), 2, 16, 1e-5f, y.data());
  for (int r = 0; r < 2; ++r) {
    double ss = 0;
    for (int i = 0; i < 16; ++i) ss += x[r * 16 + i] * static_cast<double>(x[r * 16 + i]);
    double inv = 1 / std::sqrt(ss / 16 + 1e-5);
    for (int i = 0; i < 16; ++i) EXPECT_NEAR(y[r * 16 + i], x[r * 16 + i] * inv * w[i], 1e-5);
  }
  std::vector<float> out(32);
  k.silu_mul(x.data(), w.data(), 16, out.data());
  for (int i = 0; i < 16; ++i) {
    EXPECT_NEAR(out[i], x[i] / (1 + std::exp(-static_cast<double>(x[i]))) * w[i], 1e-6);
  }
  std::vector<float> acc = x;
  k.add(acc.data(), x.data(), 32);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(acc[i], 2 * x[i]);
}

}  // namespace
}  // namespace pagoda::cpu
