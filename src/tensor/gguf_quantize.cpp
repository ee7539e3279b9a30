#include "tensor/gguf_quantize.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/check.h"
#include "tensor/gguf_blocks.h"
#include "tensor/half.h"

namespace pagoda {
namespace {

int64_t num_blocks(int64_t n, int64_t per_block) {
  PAGODA_CHECK(n >= 0 && n % per_block == 0);
  return n / per_block;
}

// std::clamp(std::lround(v), lo, hi) for every float, without lroundf's libm call (loading a
// TinyLlama-sized dummy model as q4_k took 32% less CPU time without it). Below 2^30 v - trunc(v)
// is exact; lround's results beyond long's range, infinities and NaN (LONG_MIN on x86) clamp to
// lo. An exhaustive comparison over all 2^32 floats, for [0, 63] and [-32, 31], found no
// difference.
int clamp_round(float v, int lo, int hi) {
  const float a = std::fabs(v);
  if (!(a < 0x1p30f)) return a < 0x1p63f && v > 0 ? hi : lo;
  const auto t = static_cast<int32_t>(v);  // toward zero
  const float frac = v - static_cast<float>(t);
  const int32_t r = t + (frac >= 0.5f ? 1 : 0) - (frac <= -0.5f ? 1 : 0);
  return std::clamp(r, static_cast<int32_t>(lo), static_cast<int32_t>(hi));
}

// A value stored as fp16 and read back: the scale the decoder will use.
float fp16_round(float v) { return fp16_to_f32(f32_to_fp16(v)); }

// Asymmetric: the offset and step that map [min(x, 0) or min(x), max(x)] onto codes [0, qmax].
struct Range {
  float step = 0;    // scale
  float offset = 0;  // x ~ step * code + offset
};

Range range_of(const float* x, int n, int qmax, bool clip_min_at_zero) {
  float lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  if (clip_min_at_zero) lo = std::min(lo, 0.0f);
  return {(hi - lo) / static_cast<float>(qmax), lo};
}

// Symmetric: the signed step that puts the value of largest magnitude on code -qneg.
float symmetric_step(const float* x, int n, int qneg) {
  float amax = 0, max = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  return max / static_cast<float>(-qneg);
}

int code_for(float x, float step, float offset, int lo, int hi) {
  return step == 0 ? std::clamp(0, lo, hi) : clamp_round((x - offset) / step, lo, hi);
}

// Legacy 32-element blocks: writes d, (m) and the 4-bit codes with optional fifth bits.
void put_nibbles(const int* codes, uint8_t* qs, uint8_t* qh) {
  uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((codes[j] & 0xF) | (codes[j + 16] & 0xF) << 4);
  }
  if (qh != nullptr) {
    for (int i = 0; i < 32; ++i) high |= static_cast<uint32_t>((codes[i] >> 4) & 1) << i;
    for (int b = 0; b < 4; ++b) qh[b] = static_cast<uint8_t>(high >> (8 * b));
  }
}

template <typename Block, int kQmax, bool kFifthBit>
void quantize_row_legacy_asym(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, 32); ++b) {
    const float* x = src + 32 * b;
    const Range r = range_of(x, 32, kQmax, false);
    Block blk{};
    blk.d = f32_to_fp16(r.step);
    blk.m = f32_to_fp16(r.offset);
    const float step = fp16_to_f32(blk.d), offset = fp16_to_f32(blk.m);
    int codes[32];
    for (int i = 0; i < 32; ++i) codes[i] = code_for(x[i], step, offset, 0, kQmax);
    if constexpr (kFifthBit) {
      put_nibbles(codes, blk.qs, blk.qh);
    } else {
      put_nibbles(codes, blk.qs, nullptr);
    }
    std::memcpy(static_cast<uint8_t*>(dst) + b * static_cast<int64_t>(sizeof(Block)), &blk, sizeof blk);
  }
}

// Sub-block scales of a K-quant super-block quantized against the block's d: sc = round(s / d).
struct SubScales {
  float d = 0;
  int sc[16] = {};
};

// Asymmetric K-quant super-block (Q2_K: 16 sub-blocks of 16, Q4_K / Q5_K: 8 of 32): chooses
// d, dmin, the integer (sc, mn) in [0, scale_max] and the codes in [0, qmax].
struct AsymSuperBlock {
  float d = 0, dmin = 0;
  int sc[16] = {}, mn[16] = {};
  int codes[256] = {};
};

AsymSuperBlock quantize_asym_super(const float* x, int sub_len, int qmax, int scale_max) {
  const int num_sub = 256 / sub_len;
  Range r[16];
  float max_step = 0, max_min = 0;
  for (int s = 0; s < num_sub; ++s) {
    r[s] = range_of(x + s * sub_len, sub_len, qmax, true);
    max_step = std::max(max_step, r[s].step);
    max_min = std::max(max_min, -r[s].offset);
  }
  AsymSuperBlock out;
  out.d = fp16_round(max_step / static_cast<float>(scale_max));
  out.dmin = fp16_round(max_min / static_cast<float>(scale_max));
  for (int s = 0; s < num_sub; ++s) {
    out.sc[s] = out.d == 0 ? 0 : clamp_round(r[s].step / out.d, 0, scale_max);
    out.mn[s] = out.dmin == 0 ? 0 : clamp_round(-r[s].offset / out.dmin, 0, scale_max);
    const float step = out.d * static_cast<float>(out.sc[s]);
    const float offset = -(out.dmin * static_cast<float>(out.mn[s]));
    for (int i = 0; i < sub_len; ++i) {
      const int e = s * sub_len + i;
      out.codes[e] = code_for(x[e], step, offset, 0, qmax);
    }
  }
  return out;
}

// Symmetric K-quant super-block with 16 sub-blocks of 16: codes in [-qneg, qneg - 1], integer
// sub-block scales in [-scale_neg, scale_neg - 1] (the largest magnitude on -scale_neg).
struct SymSuperBlock {
  float d = 0;
  int sc[16] = {};
  int codes[256] = {};
};

SymSuperBlock quantize_sym_super(const float* x, int qneg, int scale_neg, int scale_pos) {
  float step[16];
  for (int s = 0; s < 16; ++s) step[s] = symmetric_step(x + 16 * s, 16, qneg);
  SymSuperBlock out;
  out.d = fp16_round(symmetric_step(step, 16, scale_neg));
  for (int s = 0; s < 16; ++s) {
    out.sc[s] = out.d == 0 ? 0 : clamp_round(step[s] / out.d, -scale_neg, scale_pos);
    const float sub_step = out.d * static_cast<float>(out.sc[s]);
    for (int i = 0; i < 16; ++i) {
      out.codes[16 * s + i] = code_for(x[16 * s + i], sub_step, 0, -qneg, qneg - 1);
    }
  }
  return out;
}

template <typename Block>
void store(void* dst, int64_t b, const Block& blk) {
  std::memcpy(static_cast<uint8_t*>(dst) + b * static_cast<int64_t>(sizeof(Block)), &blk, sizeof blk);
}

// Q2_K / Q3_K 2-bit codes: element e at byte 32 * (e / 128) + e % 32, bits 2 * ((e % 128) / 32).
void put_two_bit(const int* low2, uint8_t* qs) {
  std::memset(qs, 0, 64);
  for (int e = 0; e < 256; ++e) {
    qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((low2[e] & 3) << (2 * ((e % 128) / 32)));
  }
}

// The 12 bytes of Q4_K / Q5_K 6-bit scales and mins (see k_scale_min in gguf_blocks.cpp).
void put_k_scales(const int* sc, const int* mn, uint8_t* out) {
  for (int s = 0; s < 4; ++s) {
    out[s] = static_cast<uint8_t>((sc[s] & 63) | (sc[s + 4] >> 4) << 6);
    out[s + 4] = static_cast<uint8_t>((mn[s] & 63) | (mn[s + 4] >> 4) << 6);
    out[s + 8] = static_cast<uint8_t>((sc[s + 4] & 0xF) | (mn[s + 4] & 0xF) << 4);
  }
}

template <typename Block, bool kFifthBit>
void quantize_row_k4(const float* src, void* dst, int64_t n) {
  constexpr int kQmax = kFifthBit ? 31 : 15;
  for (int64_t b = 0; b < num_blocks(n, kSuperBlock); ++b) {
    const AsymSuperBlock q = quantize_asym_super(src + kSuperBlock * b, 32, kQmax, 63);
    Block blk{};
    blk.d = f32_to_fp16(q.d);
    blk.dmin = f32_to_fp16(q.dmin);
    put_k_scales(q.sc, q.mn, blk.scales);
    for (int c = 0; c < 8; ++c) {
      for (int i = 0; i < 32; ++i) {
        const int code = q.codes[32 * c + i];
        blk.qs[32 * (c / 2) + i] |= static_cast<uint8_t>((code & 0xF) << (4 * (c % 2)));
        if constexpr (kFifthBit) blk.qh[i] |= static_cast<uint8_t>(((code >> 4) & 1) << c);
      }
    }
    store(dst, b, blk);
  }
}

}  // namespace

void quantize_row_q4_1(const float* src, void* dst, int64_t n) {
  quantize_row_legacy_asym<BlockQ4_1, 15, false>(src, dst, n);
}

void quantize_row_q5_1(const float* src, void* dst, int64_t n) {
  quantize_row_legacy_asym<BlockQ5_1, 31, true>(src, dst, n);
}

void quantize_row_q5_0(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, 32); ++b) {
    const float* x = src + 32 * b;
    BlockQ5_0 blk{};
    blk.d = f32_to_fp16(symmetric_step(x, 32, 16));
    const float step = fp16_to_f32(blk.d);
    int codes[32];
    for (int i = 0; i < 32; ++i) codes[i] = code_for(x[i], step, 0, -16, 15) + 16;
    put_nibbles(codes, blk.qs, blk.qh);
    store(dst, b, blk);
  }
}

void quantize_row_q2_k(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, kSuperBlock); ++b) {
    const AsymSuperBlock q = quantize_asym_super(src + kSuperBlock * b, 16, 3, 15);
    BlockQ2_K blk{};
    blk.d = f32_to_fp16(q.d);
    blk.dmin = f32_to_fp16(q.dmin);
    for (int s = 0; s < 16; ++s) blk.scales[s] = static_cast<uint8_t>(q.sc[s] | q.mn[s] << 4);
    put_two_bit(q.codes, blk.qs);
    store(dst, b, blk);
  }
}

void quantize_row_q3_k(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, kSuperBlock); ++b) {
    const SymSuperBlock q = quantize_sym_super(src + kSuperBlock * b, 4, 32, 31);
    BlockQ3_K blk{};
    blk.d = f32_to_fp16(q.d);
    for (int j = 0; j < 16; ++j) {
      const int stored = q.sc[j] + 32;  // 6 bits
      blk.scales[j % 8] |= static_cast<uint8_t>((stored & 0xF) << (j < 8 ? 0 : 4));
      blk.scales[8 + j % 4] |= static_cast<uint8_t>((stored >> 4) << (2 * (j / 4)));
    }
    int low2[256];
    for (int e = 0; e < 256; ++e) {
      const int code = q.codes[e];  // [-4, 3]
      const bool high = code >= 0;
      low2[e] = high ? code : code + 4;
      if (high) blk.hmask[e % 32] |= static_cast<uint8_t>(1u << (e / 32));
    }
    put_two_bit(low2, blk.qs);
    store(dst, b, blk);
  }
}

void quantize_row_q4_k(const float* src, void* dst, int64_t n) { quantize_row_k4<BlockQ4_K, false>(src, dst, n); }
void quantize_row_q5_k(const float* src, void* dst, int64_t n) { quantize_row_k4<BlockQ5_K, true>(src, dst, n); }

void quantize_row_q6_k(const float* src, void* dst, int64_t n) {
  for (int64_t b = 0; b < num_blocks(n, kSuperBlock); ++b) {
    const SymSuperBlock q = quantize_sym_super(src + kSuperBlock * b, 32, 128, 127);
    BlockQ6_K blk{};
    blk.d = f32_to_fp16(q.d);
    for (int s = 0; s < 16; ++s) blk.scales[s] = static_cast<int8_t>(q.sc[s]);
    for (int e = 0; e < 256; ++e) {
      const int code = q.codes[e] + 32;  // [0, 63]
      const int h = e / 128, t = (e % 128) / 32, l = e % 32;
      blk.ql[64 * h + 32 * (t % 2) + l] |= static_cast<uint8_t>((code & 0xF) << (t < 2 ? 0 : 4));
      blk.qh[32 * h + l] |= static_cast<uint8_t>((code >> 4) << (2 * t));
    }
    store(dst, b, blk);
  }
}

}  // namespace pagoda
