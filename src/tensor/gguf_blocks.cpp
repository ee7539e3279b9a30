// Decoders of the GGUF block types. Each walks a block in the order its bytes are laid out
// (a byte of codes at a time, feeding the elements it holds), which is how the SIMD kernels
// will read them; gguf_blocks_test.cpp checks every element against the per-element formulas
// of the format description instead.
#include "tensor/gguf_blocks.h"

#include <cstddef>
#include <cstring>

#include "base/check.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace pagoda {
namespace {

template <typename Block>
Block load(const void* src, int64_t b) {
  Block blk;
  std::memcpy(&blk, static_cast<const uint8_t*>(src) + b * static_cast<int64_t>(sizeof(Block)), sizeof blk);
  return blk;
}

int64_t num_blocks(int64_t n, int64_t per_block) {
  PAGODA_CHECK(n >= 0 && n % per_block == 0);
  return n / per_block;
}

uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

// The 6-bit (scale, min) of sub-block s of a Q4_K / Q5_K block: bytes 0-3 hold scales 0-3 (bits
// 0-5) and the top bits of scales 4-7 (bits 6-7); bytes 4-7 the same for the mins; bytes 8-11
// the low 4 bits of scales 4-7 (low nibble) and of mins 4-7 (high nibble).
void k_scale_min(const uint8_t* b, int s, int* sc, int* mn) {
  if (s < 4) {
    *sc = b[s] & 63;
    *mn = b[s + 4] & 63;
  } else {
    *sc = (b[s + 4] & 0xF) | (b[s - 4] >> 6) << 4;
    *mn = (b[s + 4] >> 4) | (b[s] >> 6) << 4;
  }
}

// A 32-element block of 4-bit codes n and optional fifth bits h: out[i] = scale * v_i + offset.
void legacy_block(const uint8_t* qs, uint32_t fifth_bits, bool has_fifth, float scale, float offset, float* out) {
  for (int j = 0; j < 16; ++j) {
    int lo = qs[j] & 0xF, hi = qs[j] >> 4;
    if (has_fifth) {
      lo |= static_cast<int>((fifth_bits >> j) & 1) << 4;
      hi |= static_cast<int>((fifth_bits >> (j + 16)) & 1) << 4;
    }
    out[j] = scale * static_cast<float>(lo) + offset;
    out[j + 16] = scale * static_cast<float>(hi) + offset;
  }
}

}  // namespace

void dequantize_row_q4_1(const void* src, float* out, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, 32); ++b) {
    const auto blk = load<BlockQ4_1>(src, b);
    legacy_block(blk.qs, 0, false, fp16_to_f32(blk.d), fp16_to_f32(blk.m), out + 32 * b);
  }
}

void dequantize_row_q5_0(const void* src, float* out, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, 32); ++b) {
    const auto blk = load<BlockQ5_0>(src, b);
    const float d = fp16_to_f32(blk.d);
    legacy_block(blk.qs, le32(blk.qh), true, d, -16.0f * d, out + 32 * b);
  }
}

void dequantize_row_q5_1(const void* src, float* out, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, 32); ++b) {
    const auto blk = load<BlockQ5_1>(src, b);
    legacy_block(blk.qs, le32(blk.qh), true, fp16_to_f32(blk.d), fp16_to_f32(blk.m), out + 32 * b);
  }
}

void dequantize_row_q2_k(const void* src, float* out, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, kSuperBlock); ++b) {
    const auto blk = load<BlockQ2_K>(src, b);
    const float d = fp16_to_f32(blk.d), dmin = fp16_to_f32(blk.dmin);
    float* y = out + kSuperBlock * b;
    // Each half of 128 elements reads 32 bytes; shift t of byte l is element 32 t + l of the half.
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = blk.qs + 32 * half;
      for (int t = 0; t < 4; ++t) {
        for (int l = 0; l < 32; ++l) {
          const int i = 128 * half + 32 * t + l;
          const uint8_t s = blk.scales[i / 16];
          y[i] = d * static_cast<float>(s & 0xF) * static_cast<float>((q[l] >> (2 * t)) & 3) -
                 dmin * static_cast<float>(s >> 4);
        }
      }
    }
  }
}

void dequantize_row_q3_k(const void* src, float* out, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, kSuperBlock); ++b) {
    const auto blk = load<BlockQ3_K>(src, b);
    const float d = fp16_to_f32(blk.d);
    int scales[16];
    for (int j = 0; j < 16; ++j) {
      const int low4 = j < 8 ? blk.scales[j] & 0xF : blk.scales[j - 8] >> 4;
      const int hi2 = (blk.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
      scales[j] = (low4 | hi2 << 4) - 32;
    }
    float* y = out + kSuperBlock * b;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* q = blk.qs + 32 * half;
      for (int t = 0; t < 4; ++t) {
        const int mask_bit = 4 * half + t;
        for (int l = 0; l < 32; ++l) {
          const int i = 128 * half + 32 * t + l;
          const int low2 = (q[l] >> (2 * t)) & 3;
          const int code = low2 - (((blk.hmask[l] >> mask_bit) & 1) ? 0 : 4);
          y[i] = d * static_cast<float>(scales[i / 16]) * static_cast<float>(code);
        }
      }
    }
  }
}

namespace {

// Q4_K and Q5_K: chunk c of 64 elements reads 32 bytes of qs, low nibbles first.
template <typename Block, bool kFifthBit>
void dequantize_row_k4(const void* src, float* out, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, kSuperBlock); ++b) {
    const auto blk = load<Block>(src, b);
    const float d = fp16_to_f32(blk.d), dmin = fp16_to_f32(blk.dmin);
    float* y = out + kSuperBlock * b;
    for (int c = 0; c < 4; ++c) {
      for (int part = 0; part < 2; ++part) {
        const int s = 2 * c + part;
        int sc = 0, mn = 0;
        k_scale_min(blk.scales, s, &sc, &mn);
        const float scale = d * static_cast<float>(sc), offset = dmin * static_cast<float>(mn);
        for (int l = 0; l < 32; ++l) {
          int q = part == 0 ? blk.qs[32 * c + l] & 0xF : blk.qs[32 * c + l] >> 4;
          if constexpr (kFifthBit) q += ((blk.qh[l] >> s) & 1) << 4;
          y[32 * s + l] = scale * static_cast<float>(q) - offset;
        }
      }
    }
  }
}

}  // namespace

void dequantize_row_q4_k(const void* src, float* out, int64_t n) { dequantize_row_k4<BlockQ4_K, false>(src, out, n); }
void dequantize_row_q5_k(const void* src, float* out, int64_t n) { dequantize_row_k4<BlockQ5_K, true>(src, out, n); }

void dequantize_row_q6_k(const void* src, float* out, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, kSuperBlock); ++b) {
    const auto blk = load<BlockQ6_K>(src, b);
    const float d = fp16_to_f32(blk.d);
    float* y = out + kSuperBlock * b;
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = blk.ql + 64 * half;
      const uint8_t* qh = blk.qh + 32 * half;
      for (int l = 0; l < 32; ++l) {
        // One qh byte holds the high bits of the four elements l, l + 32, l + 64, l + 96.
        const int q[4] = {(ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4, (ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4,
                          (ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4, (ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4};
        for (int t = 0; t < 4; ++t) {
          const int i = 128 * half + 32 * t + l;
          y[i] = d * static_cast<float>(blk.scales[i / 16]) * static_cast<float>(q[t] - 32);
        }
      }
    }
  }
}

// ---- Block decoders to integer chunks (QuantChunk) ----
//
// Written from the layouts apart from the row decoders (each chunk's bytes located from its
// index), so that the test that the two agree compares two readings of the format.

namespace {

void set_scales(QuantChunk* c, float d, float dmin, int sc0, int sc1, int mn0, int mn1) {
  c->d = d;
  c->dmin = dmin;
  c->sc[0] = sc0;
  c->sc[1] = sc1;
  c->mn[0] = mn0;
  c->mn[1] = mn1;
}

// The 32 codes of a legacy block: 4-bit codes n_i (byte j holds n_j low, n_{j+16} high), plus
// the fifth bit i of qh when it is given, minus `offset`.
void legacy_codes(const uint8_t* qs, const uint8_t* qh, int offset, int8_t* q) {
  const uint32_t fifth = qh == nullptr ? 0 : le32(qh);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>((qs[j] & 0xF) + static_cast<int>((fifth >> j) & 1) * 16 - offset);
    q[j + 16] = static_cast<int8_t>((qs[j] >> 4) + static_cast<int>((fifth >> (j + 16)) & 1) * 16 - offset);
  }
}

// Chunk c (32 elements from 32 c) of a Q2_K / Q3_K block's 2-bit codes: element e sits in byte
// 32 * (e / 128) + e % 32 at shift 2 * ((e % 128) / 32), so the chunk reads 32 consecutive bytes
// from 32 * (c / 4) at shift 2 * (c % 4).
void two_bit_codes(const uint8_t* qs, int c, int8_t* q) {
  const uint8_t* bytes = qs + 32 * (c / 4);
  const int shift = 2 * (c % 4);
  for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>((bytes[i] >> shift) & 3);
}

}  // namespace

void decode_chunks_q8_0(const void* block, QuantChunk* out) {
  BlockQ8_0 b;
  std::memcpy(&b, block, sizeof b);
  set_scales(out, fp16_to_f32(b.d), 0, 1, 1, 0, 0);
  std::memcpy(out->q, b.qs, kQuantBlock);
}

void decode_chunks_q4_0(const void* block, QuantChunk* out) {
  BlockQ4_0 b;
  std::memcpy(&b, block, sizeof b);
  set_scales(out, fp16_to_f32(b.d), 0, 1, 1, 0, 0);
  legacy_codes(b.qs, nullptr, 8, out->q);
}

void decode_chunks_q4_1(const void* block, QuantChunk* out) {
  BlockQ4_1 b;
  std::memcpy(&b, block, sizeof b);
  set_scales(out, fp16_to_f32(b.d), -fp16_to_f32(b.m), 1, 1, 1, 1);
  legacy_codes(b.qs, nullptr, 0, out->q);
}

void decode_chunks_q5_0(const void* block, QuantChunk* out) {
  BlockQ5_0 b;
  std::memcpy(&b, block, sizeof b);
  set_scales(out, fp16_to_f32(b.d), 0, 1, 1, 0, 0);
  legacy_codes(b.qs, b.qh, 16, out->q);
}

void decode_chunks_q5_1(const void* block, QuantChunk* out) {
  BlockQ5_1 b;
  std::memcpy(&b, block, sizeof b);
  set_scales(out, fp16_to_f32(b.d), -fp16_to_f32(b.m), 1, 1, 1, 1);
  legacy_codes(b.qs, b.qh, 0, out->q);
}

void decode_chunks_q2_k(const void* block, QuantChunk* out) {
  BlockQ2_K b;
  std::memcpy(&b, block, sizeof b);
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int c = 0; c < 8; ++c) {
    const uint8_t s0 = b.scales[2 * c], s1 = b.scales[2 * c + 1];
    set_scales(&out[c], d, dmin, s0 & 0xF, s1 & 0xF, s0 >> 4, s1 >> 4);
    two_bit_codes(b.qs, c, out[c].q);
  }
}

void decode_chunks_q3_k(const void* block, QuantChunk* out) {
  BlockQ3_K b;
  std::memcpy(&b, block, sizeof b);
  const float d = fp16_to_f32(b.d);
  // Sub-block j's 6-bit scale: low 4 bits in scales[j % 8] (low nibble for j < 8, high after),
  // high 2 bits at bit 2 * (j / 4) of scales[8 + j % 4]; stored + 32.
  auto scale = [&](int j) {
    const int low4 = (b.scales[j % 8] >> (j < 8 ? 0 : 4)) & 0xF;
    const int hi2 = (b.scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    return (low4 | hi2 << 4) - 32;
  };
  for (int c = 0; c < 8; ++c) {
    set_scales(&out[c], d, 0, scale(2 * c), scale(2 * c + 1), 0, 0);
    two_bit_codes(b.qs, c, out[c].q);
    // Element 32 c + i's bit is bit c of hmask[i]: set, the code stands; clear, it loses 4.
    for (int i = 0; i < 32; ++i) {
      out[c].q[i] = static_cast<int8_t>(out[c].q[i] - 4 + 4 * ((b.hmask[i] >> c) & 1));
    }
  }
}

namespace {

// Q4_K / Q5_K: chunk c is sub-block c (32 elements), its codes the low (c even) or high (c odd)
// nibbles of qs[32 * (c / 2) ..], plus bit c of qh[i] for Q5_K.
template <typename Block, bool kFifthBit>
void decode_chunks_k4(const void* block, QuantChunk* out) {
  Block b;
  std::memcpy(&b, block, sizeof b);
  const float d = fp16_to_f32(b.d), dmin = fp16_to_f32(b.dmin);
  for (int c = 0; c < 8; ++c) {
    int sc = 0, mn = 0;
    k_scale_min(b.scales, c, &sc, &mn);
    set_scales(&out[c], d, dmin, sc, sc, mn, mn);
    const uint8_t* qs = b.qs + 32 * (c / 2);
    int8_t* q = out[c].q;
    if (c % 2 == 0) {
      for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(qs[i] & 0xF);
    } else {
      for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(qs[i] >> 4);
    }
    if constexpr (kFifthBit) {
      for (int i = 0; i < 32; ++i) q[i] = static_cast<int8_t>(q[i] | ((b.qh[i] >> c) & 1) << 4);
    }
  }
}

}  // namespace

void decode_chunks_q4_k(const void* block, QuantChunk* out) { decode_chunks_k4<BlockQ4_K, false>(block, out); }
void decode_chunks_q5_k(const void* block, QuantChunk* out) { decode_chunks_k4<BlockQ5_K, true>(block, out); }

void decode_chunks_q6_k(const void* block, QuantChunk* out) {
  BlockQ6_K b;
  std::memcpy(&b, block, sizeof b);
  const float d = fp16_to_f32(b.d);
  for (int c = 0; c < 8; ++c) {
    set_scales(&out[c], d, 0, b.scales[2 * c], b.scales[2 * c + 1], 0, 0);
    // Element e = 32 c + i: half h = c / 4, quarter t = c % 4. Low 4 bits: the low (t < 2) or
    // high nibble of ql[64 h + 32 (t % 2) + i]; high 2 bits: bits 2t of qh[32 h + i].
    const int h = c / 4, t = c % 4;
    const uint8_t* ql = b.ql + 64 * h + 32 * (t % 2);
    const uint8_t* qh = b.qh + 32 * h;
    const int low_shift = t < 2 ? 0 : 4;
    for (int i = 0; i < 32; ++i) {
      const int low4 = (ql[i] >> low_shift) & 0xF;
      const int high2 = (qh[i] >> (2 * t)) & 3;
      out[c].q[i] = static_cast<int8_t>((low4 | high2 << 4) - 32);
    }
  }
}

namespace {

// The blocks are bytes (packed structs, read and written through their fields' offsets).
void set_nibble(uint8_t* qs, int e32, int v) {  // legacy order: byte j holds elements j, j + 16
  uint8_t& b = qs[e32 % 16];
  b = e32 < 16 ? static_cast<uint8_t>((b & 0xF0) | (v & 0xF)) : static_cast<uint8_t>((b & 0x0F) | (v & 0xF) << 4);
}
void set_bit(uint8_t* bytes, int index, int v) {
  uint8_t& b = bytes[index / 8];
  b = static_cast<uint8_t>((b & ~(1u << (index % 8))) | static_cast<unsigned>(v & 1) << (index % 8));
}
void set_two_bits(uint8_t* qs, int e256, int v) {  // Q2_K / Q3_K's 2-bit codes
  uint8_t& b = qs[32 * (e256 / 128) + e256 % 32];
  const int shift = 2 * ((e256 % 128) / 32);
  b = static_cast<uint8_t>((b & ~(3u << shift)) | static_cast<unsigned>(v & 3) << shift);
}
// Q4_K / Q5_K: sub-block s of 32 in the low (even s) or high nibbles of 32 bytes.
void set_k_nibble(uint8_t* qs, int e, int q) {
  const int s = e / 32, l = e % 32;
  uint8_t& b = qs[32 * (s / 2) + l];
  b = s % 2 == 0 ? static_cast<uint8_t>((b & 0xF0) | (q & 0xF)) : static_cast<uint8_t>((b & 0x0F) | (q & 0xF) << 4);
}

}  // namespace

void set_code_q8_0(uint8_t* block, int e, int q) {
  block[offsetof(BlockQ8_0, qs) + e] = static_cast<uint8_t>(static_cast<int8_t>(q));
}
void set_code_q4_0(uint8_t* block, int e, int q) { set_nibble(block + offsetof(BlockQ4_0, qs), e, q + 8); }
void set_code_q4_1(uint8_t* block, int e, int q) { set_nibble(block + offsetof(BlockQ4_1, qs), e, q); }
void set_code_q5_0(uint8_t* block, int e, int q) {
  set_nibble(block + offsetof(BlockQ5_0, qs), e, q + 16);
  set_bit(block + offsetof(BlockQ5_0, qh), e, (q + 16) >> 4);  // little-endian uint32: bit e
}
void set_code_q5_1(uint8_t* block, int e, int q) {
  set_nibble(block + offsetof(BlockQ5_1, qs), e, q);
  set_bit(block + offsetof(BlockQ5_1, qh), e, q >> 4);
}
void set_code_q2_k(uint8_t* block, int e, int q) { set_two_bits(block + offsetof(BlockQ2_K, qs), e, q); }
void set_code_q3_k(uint8_t* block, int e, int q) {
  const bool high = q >= 0;  // a set hmask bit keeps the 2-bit code; a clear one subtracts 4
  set_two_bits(block + offsetof(BlockQ3_K, qs), e, high ? q : q + 4);
  set_bit(block + offsetof(BlockQ3_K, hmask) + e % 32, e / 32, high ? 1 : 0);
}
void set_code_q4_k(uint8_t* block, int e, int q) { set_k_nibble(block + offsetof(BlockQ4_K, qs), e, q); }
void set_code_q5_k(uint8_t* block, int e, int q) {
  set_k_nibble(block + offsetof(BlockQ5_K, qs), e, q);
  set_bit(block + offsetof(BlockQ5_K, qh) + e % 32, e / 32, q >> 4);
}
void set_code_q6_k(uint8_t* block, int e, int q) {
  const int v = q + 32, h = e / 128, t = (e % 128) / 32, l = e % 32;
  uint8_t& low = block[offsetof(BlockQ6_K, ql) + 64 * h + 32 * (t % 2) + l];
  low = t < 2 ? static_cast<uint8_t>((low & 0xF0) | (v & 0xF)) : static_cast<uint8_t>((low & 0x0F) | (v & 0xF) << 4);
  uint8_t& high = block[offsetof(BlockQ6_K, qh) + 32 * h + l];
  high = static_cast<uint8_t>((high & ~(3u << (2 * t))) | static_cast<unsigned>(v >> 4) << (2 * t));
}

}  // namespace pagoda
