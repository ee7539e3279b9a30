// The GGUF block decoders, checked two ways: blocks built byte by byte with values worked out by
// hand from the format description (shared/docs/quantization-formats.md 1.3, 1.4), and every
// element of random blocks against a reference written here from that description's
// per-element formulas (element i's bits located directly, in double), not from the decoders'
// byte-walking loops.
#include "tensor/gguf_blocks.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace pagoda {
namespace {

constexpr uint16_t kOne = 0x3C00, kHalf = 0x3800, kQuarter = 0x3400, kTwo = 0x4000, kMinusOne = 0xBC00;

template <typename Block>
std::vector<float> decode(const Block& b, void (*f)(const void*, float*, int64_t), int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  f(&b, out.data(), n);
  return out;
}

TEST(GgufBlocks, LegacyBlocksByHand) {
  BlockQ4_1 a{};
  a.d = kHalf;
  a.m = kMinusOne;
  a.qs[3] = 0x16;  // element 3: 6, element 19: 1
  auto y = decode(a, dequantize_row_q4_1, 32);
  EXPECT_EQ(y[3], 0.5f * 6 - 1);   // 2
  EXPECT_EQ(y[19], 0.5f * 1 - 1);  // -0.5
  EXPECT_EQ(y[0], -1.0f);          // code 0: the min

  BlockQ5_0 b{};
  b.d = kHalf;
  b.qs[1] = 0x4F;  // element 1: 15, element 17: 4
  b.qh[2] = 0x02;  // bit 17: element 17's fifth bit
  y = decode(b, dequantize_row_q5_0, 32);
  EXPECT_EQ(y[1], 0.5f * (15 - 16));       // -0.5
  EXPECT_EQ(y[17], 0.5f * ((4 + 16) - 16));  // 2
  EXPECT_EQ(y[0], 0.5f * -16);             // -8

  BlockQ5_1 c{};
  c.d = kOne;
  c.m = kHalf;
  c.qs[15] = 0x20;  // element 31: 2
  c.qh[3] = 0x80;   // bit 31
  y = decode(c, dequantize_row_q5_1, 32);
  EXPECT_EQ(y[31], 18.5f);  // 1 * (2 + 16) + 0.5
  EXPECT_EQ(y[15], 0.5f);
}

TEST(GgufBlocks, KQuantsByHand) {
  BlockQ2_K q2{};
  q2.d = kTwo;
  q2.dmin = kOne;
  q2.scales[0] = 0x31;  // sub-block 0: sc 1, mn 3
  q2.scales[2] = 0x02;  // sub-block 2 (elements 32-47): sc 2, mn 0
  q2.qs[0] = 0x0E;      // element 0: bits 0-1 = 2; element 32: bits 2-3 = 3
  auto y = decode(q2, dequantize_row_q2_k, 256);
  EXPECT_EQ(y[0], 2.0f * 1 * 2 - 1.0f * 3);  // 1
  EXPECT_EQ(y[32], 2.0f * 2 * 3);            // 12
  EXPECT_EQ(y[1], -3.0f);                    // code 0 in sub-block 0: -dmin * mn

  BlockQ3_K q3{};
  q3.d = kOne;
  q3.scales[0] = 0x05;  // scale 0: low 4 bits 5
  q3.scales[8] = 0x42;  // bits 0-1: scale 0's top bits (2); bits 6-7: scale 12's (1)
  q3.scales[4] = 0x10;  // high nibble: scale 12's low 4 bits (1)
  q3.qs[0] = 0x03;      // element 0: low2 3
  q3.qs[1] = 0x02;      // element 1: low2 2
  q3.hmask[1] = 0x01;   // element 1: set bit, no offset
  q3.qs[32] = 0x30;     // element 192 (second half, shift 4): low2 3
  q3.hmask[0] = 0x40;   // element 192's bit (4 * 1 + 2 = 6): no offset
  y = decode(q3, dequantize_row_q3_k, 256);
  // scale 0 = (5 | 2 << 4) - 32 = 5; scale 12 = (1 | 1 << 4) - 32 = -15
  EXPECT_EQ(y[0], 5.0f * (3 - 4));   // -5: clear mask bit subtracts 4
  EXPECT_EQ(y[1], 5.0f * 2);         // 10
  EXPECT_EQ(y[192], -15.0f * 3);     // -45

  BlockQ4_K q4{};
  q4.d = kOne;
  q4.dmin = kHalf;
  q4.scales[0] = 3;     // scale 0
  q4.scales[4] = 2;     // min 0
  q4.scales[9] = 0x21;  // scale 5 low 4 bits 1, min 5 low 4 bits 2
  q4.scales[1] = 0xC0;  // scale 5's top bits: 3
  q4.scales[5] = 0x40;  // min 5's top bits: 1
  q4.qs[0] = 0x05;      // element 0 (chunk 0, low nibble): 5
  q4.qs[64] = 0x70;     // element 160 (chunk 2, high nibble = sub-block 5): 7
  y = decode(q4, dequantize_row_q4_k, 256);
  EXPECT_EQ(y[0], 1.0f * 3 * 5 - 0.5f * 2);         // 14
  EXPECT_EQ(y[160], 1.0f * 49 * 7 - 0.5f * 18);     // 334: scale 5 = 1 | 3 << 4, min 5 = 2 | 1 << 4
  EXPECT_EQ(y[128], -0.5f * 0);                     // sub-block 4: scale and min 0

  BlockQ5_K q5{};
  q5.d = kOne;
  q5.dmin = kOne;
  q5.scales[2] = 1;    // scale 2
  q5.scales[6] = 4;    // min 2
  q5.qs[33] = 0x09;    // element 65 (chunk 1, low nibble = sub-block 2): 9
  q5.qh[1] = 0x04;     // bit 2 of qh[1]: element 65's fifth bit
  y = decode(q5, dequantize_row_q5_k, 256);
  EXPECT_EQ(y[65], 1.0f * 1 * (9 + 16) - 4);  // 21

  BlockQ6_K q6{};
  q6.d = kQuarter;
  q6.scales[0] = 2;
  q6.scales[6] = -3;
  q6.ql[0] = 0x0A;   // element 0: low 4 bits 10
  q6.qh[0] = 0x42;   // element 0: high bits 2 (bits 0-1); element 96: 1 (bits 6-7)
  q6.ql[32] = 0x30;  // element 96 (t = 3): high nibble 3
  y = decode(q6, dequantize_row_q6_k, 256);
  EXPECT_EQ(y[0], 0.25f * 2 * ((10 | 2 << 4) - 32));  // 5
  EXPECT_EQ(y[96], 0.25f * -3 * ((3 | 1 << 4) - 32));  // 9.75
}

// ---- the per-element reference -----------------------------------------------------------------

double h(uint16_t v) { return static_cast<double>(fp16_to_f32(v)); }
int nibble(const uint8_t* qs, int i) { return i < 16 ? qs[i] & 0xF : qs[i - 16] >> 4; }
int bit(const uint8_t* qh, int i) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return static_cast<int>((v >> i) & 1);
}

double ref_q4_1(const BlockQ4_1& b, int i) { return h(b.d) * nibble(b.qs, i) + h(b.m); }
double ref_q5_0(const BlockQ5_0& b, int i) { return h(b.d) * ((nibble(b.qs, i) | bit(b.qh, i) << 4) - 16); }
double ref_q5_1(const BlockQ5_1& b, int i) { return h(b.d) * (nibble(b.qs, i) | bit(b.qh, i) << 4) + h(b.m); }

double ref_q2_k(const BlockQ2_K& b, int i) {
  const int half = i / 128, r = i % 128, l = i % 32;
  const int q = (b.qs[32 * half + l] >> (2 * (r / 32))) & 3;
  return h(b.d) * (b.scales[i / 16] & 0xF) * q - h(b.dmin) * (b.scales[i / 16] >> 4);
}

double ref_q3_k(const BlockQ3_K& b, int i) {
  const int half = i / 128, r = i % 128, l = i % 32, j = i / 16;
  const int low2 = (b.qs[32 * half + l] >> (2 * (r / 32))) & 3;
  const int hbit = (b.hmask[l] >> (4 * half + r / 32)) & 1;
  const int low4 = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
  const int hi2 = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return h(b.d) * ((low4 | hi2 << 4) - 32) * (low2 - (hbit ? 0 : 4));
}

template <typename Block>
void ref_scale_min(const Block& b, int s, int* sc, int* mn) {
  const uint8_t* B = b.scales;
  *sc = s < 4 ? B[s] & 63 : (B[s + 4] & 0xF) | (B[s - 4] >> 6) << 4;
  *mn = s < 4 ? B[s + 4] & 63 : (B[s + 4] >> 4) | (B[s] >> 6) << 4;
}

double ref_q4_k(const BlockQ4_K& b, int i) {
  const int c = i / 64, u = i % 64;
  const uint8_t byte = b.qs[32 * c + u % 32];
  const int q = u < 32 ? byte & 0xF : byte >> 4;
  int sc, mn;
  ref_scale_min(b, i / 32, &sc, &mn);
  return h(b.d) * sc * q - h(b.dmin) * mn;
}

double ref_q5_k(const BlockQ5_K& b, int i) {
  const int c = i / 64, u = i % 64;
  const uint8_t byte = b.qs[32 * c + u % 32];
  const int q = (u < 32 ? byte & 0xF : byte >> 4) + 16 * ((b.qh[i % 32] >> (i / 32)) & 1);
  int sc, mn;
  ref_scale_min(b, i / 32, &sc, &mn);
  return h(b.d) * sc * q - h(b.dmin) * mn;
}

double ref_q6_k(const BlockQ6_K& b, int i) {
  const int half = i / 128, r = i % 128, l = i % 32, t = r / 32;
  const uint8_t lo = b.ql[64 * half + l + 32 * (t & 1)];
  const int low4 = t < 2 ? lo & 0xF : lo >> 4;
  const int high2 = (b.qh[32 * half + l] >> (2 * t)) & 3;
  return h(b.d) * b.scales[i / 16] * ((low4 | high2 << 4) - 32);
}

// Three random blocks per type (finite fp16 scales), decoded as one row, element by element.
template <typename Block>
void check_random(void (*decoder)(const void*, float*, int64_t), double (*ref)(const Block&, int), int per_block) {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(-2.0f, 2.0f);
  std::vector<Block> blocks(3);
  for (Block& b : blocks) {
    auto* p = reinterpret_cast<uint8_t*>(&b);
    for (size_t k = 0; k < sizeof(Block); ++k) p[k] = static_cast<uint8_t>(byte(rng));
    b.d = f32_to_fp16(scale(rng));
    if constexpr (requires { b.dmin; }) b.dmin = f32_to_fp16(scale(rng));
    if constexpr (requires { b.m; }) b.m = f32_to_fp16(scale(rng));
  }
  const int64_t n = static_cast<int64_t>(blocks.size()) * per_block;
  std::vector<float> y(static_cast<size_t>(n));
  decoder(blocks.data(), y.data(), n);
  for (int64_t e = 0; e < n; ++e) {
    const double want = ref(blocks[static_cast<size_t>(e / per_block)], static_cast<int>(e % per_block));
    ASSERT_NEAR(y[static_cast<size_t>(e)], want, 1e-5 * (1 + std::abs(want))) << "element " << e;
  }
}

TEST(GgufBlocks, EveryElementMatchesTheFormatsFormulas) {
  check_random<BlockQ4_1>(dequantize_row_q4_1, ref_q4_1, 32);
  check_random<BlockQ5_0>(dequantize_row_q5_0, ref_q5_0, 32);
  check_random<BlockQ5_1>(dequantize_row_q5_1, ref_q5_1, 32);
  check_random<BlockQ2_K>(dequantize_row_q2_k, ref_q2_k, 256);
  check_random<BlockQ3_K>(dequantize_row_q3_k, ref_q3_k, 256);
  check_random<BlockQ4_K>(dequantize_row_q4_k, ref_q4_k, 256);
  check_random<BlockQ5_K>(dequantize_row_q5_k, ref_q5_k, 256);
  check_random<BlockQ6_K>(dequantize_row_q6_k, ref_q6_k, 256);
}

// ---- The traits table's chunk decoders and quantizers ----

// Random blocks of a quantized type: random bytes, redrawn until every fp16 scale is finite and
// moderate (a random fp16 field is inf / NaN one time in 32).
std::vector<uint8_t> random_blocks(const DTypeTraits& t, int64_t num_blocks, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> bytes(static_cast<size_t>(num_blocks * t.block_bytes));
  std::vector<QuantChunk> chunks(static_cast<size_t>(t.block_elems / 32));
  for (int64_t b = 0; b < num_blocks; ++b) {
    uint8_t* blk = bytes.data() + b * t.block_bytes;
    for (bool ok = false; !ok;) {
      for (int64_t i = 0; i < t.block_bytes; ++i) blk[i] = static_cast<uint8_t>(rng());
      t.decode_chunks(blk, chunks.data());
      ok = true;
      for (const QuantChunk& c : chunks) ok = ok && std::fabs(c.d) < 1e3f && std::fabs(c.dmin) < 1e3f;
    }
  }
  return bytes;
}

// Chunks dequantized as QuantChunk says, (d * sc) * q - (dmin * mn) in f32, give exactly the row
// decoder's values: the two decoders (one walking bytes, one per element) read the same format.
TEST(DTypeTraits, ChunkDecodersAgreeWithRowDecoders) {
  for (const DTypeTraits& t : all_dtypes()) {
    if (t.decode_chunks == nullptr) {
      EXPECT_EQ(t.block_elems, 1) << t.name;
      continue;
    }
    const int64_t num_blocks = 4, n = num_blocks * t.block_elems;
    const std::vector<uint8_t> bytes = random_blocks(t, num_blocks, 17);
    std::vector<float> want(static_cast<size_t>(n));
    t.dequantize_row(bytes.data(), want.data(), n);
    std::vector<QuantChunk> chunks(static_cast<size_t>(n / 32));
    for (int64_t b = 0; b < num_blocks; ++b) {
      t.decode_chunks(bytes.data() + b * t.block_bytes, chunks.data() + b * t.block_elems / 32);
    }
    bool saw_min = false;
    for (int64_t e = 0; e < n; ++e) {
      const QuantChunk& c = chunks[static_cast<size_t>(e / 32)];
      const int h = static_cast<int>(e % 32) / 16;
      const float got = (c.d * static_cast<float>(c.sc[h])) * static_cast<float>(c.q[e % 32]) -
                        c.dmin * static_cast<float>(c.mn[h]);
      ASSERT_EQ(got, want[static_cast<size_t>(e)]) << t.name << " element " << e;
      saw_min = saw_min || (c.dmin != 0 && c.mn[h] != 0);
    }
    EXPECT_EQ(saw_min, t.has_mins) << t.name << ": has_mins must say whether chunks carry mins";
  }
}

// The table's other columns: names round-trip, sizes are the block structs', every type has a
// quantizer that writes what its dequantizer reads.
TEST(DTypeTraits, ColumnsAreConsistent) {
  for (const DTypeTraits& t : all_dtypes()) {
    EXPECT_EQ(dtype_from_name(t.name), t.type);
    EXPECT_EQ(&dtype_traits(t.type), &t);
    EXPECT_EQ(is_quantized(t.type), t.block_elems > 1);
    EXPECT_TRUE(t.block_elems == 1 || t.block_elems == 32 || t.block_elems == kSuperBlock) << t.name;
    EXPECT_NE(t.quantize_row, nullptr) << t.name;
    EXPECT_EQ(dtype_bytes(t.type, static_cast<uint64_t>(t.block_elems) * 3), static_cast<uint64_t>(3 * t.block_bytes));
    EXPECT_EQ(dtype_bytes(t.type, static_cast<uint64_t>(t.block_elems) + 1), t.block_elems == 1 ? std::optional<uint64_t>(static_cast<uint64_t>(t.block_elems + 1) * t.block_bytes) : std::nullopt);
  }
  EXPECT_EQ(dtype_from_name("q4_k_m"), std::nullopt);  // a file mix, not a tensor type
}

// Quantize -> dequantize over rows of uniform values in [-1, 1]: with b bits of code the nominal
// step is 2 / (2^b - 1); every element comes back within one step (the half step of rounding,
// the rounding of the scales, and clipping at the ends of the sub-block ranges), and the RMS
// error is at most 0.4 steps (uniform rounding alone gives 0.29).
TEST(DTypeTraits, QuantizersRoundTripWithinTheirStep) {
  const struct {
    DType type;
    int bits;
  } kTypes[] = {{DType::kQ8_0, 8}, {DType::kQ4_0, 4}, {DType::kQ4_1, 4}, {DType::kQ5_0, 5}, {DType::kQ5_1, 5},
                {DType::kQ2_K, 2}, {DType::kQ3_K, 3}, {DType::kQ4_K, 4}, {DType::kQ5_K, 5}, {DType::kQ6_K, 6}};
  std::mt19937 rng(23);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const int64_t n = 4 * kSuperBlock;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  for (int64_t e = 256; e < 288; ++e) x[static_cast<size_t>(e)] = 0;           // a zero sub-block
  for (int64_t e = 512; e < 768; ++e) x[static_cast<size_t>(e)] *= 0.01f;      // a quiet super-block
  for (int64_t e = 768; e < 800; ++e) x[static_cast<size_t>(e)] = 0.5f + 0.25f * dist(rng);  // one-signed
  for (const auto& [type, bits] : kTypes) {
    const DTypeTraits& t = dtype_traits(type);
    std::vector<uint8_t> q(static_cast<size_t>(*dtype_bytes(type, n)));
    std::vector<float> back(static_cast<size_t>(n));
    t.quantize_row(x.data(), q.data(), n);
    t.dequantize_row(q.data(), back.data(), n);
    const double step = 2.0 / ((1 << bits) - 1);
    double sq = 0;
    for (int64_t e = 0; e < n; ++e) {
      const double err = std::fabs(double{back[static_cast<size_t>(e)]} - x[static_cast<size_t>(e)]);
      ASSERT_LE(err, step) << t.name << " element " << e << ": " << x[static_cast<size_t>(e)] << " came back as "
                           << back[static_cast<size_t>(e)];
      sq += err * err;
    }
    EXPECT_LE(std::sqrt(sq / static_cast<double>(n)), 0.4 * step) << t.name;
    // The zero sub-block stays zero.
    for (int64_t e = 256; e < 288; ++e) EXPECT_EQ(back[static_cast<size_t>(e)], 0.0f) << t.name << " " << e;
  }
}

// Codes round half away from zero (std::lround's rule, and llama.cpp's): a block whose step is
// exactly 1 puts x = k + 0.5 on a tie. Q5_0's step is its largest magnitude / -16 (here -16 / -16);
// Q4_1's is (max - min) / 15 with min 0 (here 15 / 15). Round half to even would give 2 for 2.5;
// floor(x + 0.5) would give 1 for the float just below 0.5.
TEST(DTypeTraits, QuantizersRoundHalfAwayFromZero) {
  const float below_half = std::nextafter(0.5f, 0.0f);
  std::vector<float> x(32, 0.0f);
  x[0] = -16;
  const float q5_in[] = {2.5f, -2.5f, 0.5f, -0.5f, below_half, -below_half, 3.5f, 15.5f, -15.5f};
  const float q5_out[] = {3, -3, 1, -1, 0, 0, 4, 15, -16};
  for (size_t i = 0; i < std::size(q5_in); ++i) x[1 + i] = q5_in[i];
  std::vector<uint8_t> q(static_cast<size_t>(*dtype_bytes(DType::kQ5_0, 32)));
  std::vector<float> back(32);
  dtype_traits(DType::kQ5_0).quantize_row(x.data(), q.data(), 32);
  dtype_traits(DType::kQ5_0).dequantize_row(q.data(), back.data(), 32);
  for (size_t i = 0; i < std::size(q5_in); ++i) EXPECT_EQ(back[1 + i], q5_out[i]) << "q5_0, x = " << q5_in[i];

  std::fill(x.begin(), x.end(), 0.0f);
  x[0] = 15;
  const float q4_in[] = {2.5f, 0.5f, below_half, 1.5f, 14.5f};
  const float q4_out[] = {3, 1, 0, 2, 15};
  for (size_t i = 0; i < std::size(q4_in); ++i) x[1 + i] = q4_in[i];
  q.assign(static_cast<size_t>(*dtype_bytes(DType::kQ4_1, 32)), 0);
  dtype_traits(DType::kQ4_1).quantize_row(x.data(), q.data(), 32);
  dtype_traits(DType::kQ4_1).dequantize_row(q.data(), back.data(), 32);
  for (size_t i = 0; i < std::size(q4_in); ++i) EXPECT_EQ(back[1 + i], q4_out[i]) << "q4_1, x = " << q4_in[i];
}

}  // namespace
}  // namespace pagoda
