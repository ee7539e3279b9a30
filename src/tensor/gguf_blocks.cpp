// Decoders of the GGUF block types. Each walks a block in the order its bytes are laid out
// (a byte of codes at a time, feeding the elements it holds), which is how the SIMD kernels
// will read them; gguf_blocks_test.cpp checks every element against the per-element formulas
// of the format description instead.
#include "tensor/gguf_blocks.h"

#include <cstring>

#include "base/check.h"
#include "tensor/half.h"

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

}  // namespace pagoda
