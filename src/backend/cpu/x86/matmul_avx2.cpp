// The AVX2 + FMA + F16C matmul leaf loops, over weights packed in panels (x86_kernels.h describes
// the layout, packed_weights.cpp makes it), and the quantization of activations for the int8
// path. Built with those flags and -ffp-contract=off (see src/backend/cpu/x86/CMakeLists.txt); read
// x86_kernels.h before adding an #include here.
//
// Shape of the computation: the 8 lanes of a vector are 8 outputs (the 8 rows of a panel), so an
// output is one lane's running sum, added to in k order: no horizontal sums, and one broadcast
// input value or group feeds a whole panel. A register tile holds R input rows x P panels.
//  - f32 / f16 / bf16: per k element, the panel's 8 weights converted to f32 and one FMA per
//    input row and panel.
//  - quantized types: per 32-element block (or sub-block), the exact integer dot of each of the 8
//    rows with the input's BlockQ8Act (vpmaddubsw on groups of 4 bytes, input bytes broadcast),
//    then acc += float(dot) * (d_w * d_x) as a multiply and an add (and the mins' term where the
//    type has one), in the reference kernel's order and rounding: bit for bit its result.
// An output's sum is the same sequence of operations for every m, tile shape, k slicing (the
// running sum is stored to y and loaded back between slices) and split over threads.
//
// matmul_avxvnni.cpp builds this file a second time with -mavxvnni and PAGODA_AVXVNNI set, for
// the avxvnni table, and matmul_avx512vl.cpp a third, with -mavx512vl -mavx512vnni and
// PAGODA_AVX512VL_VNNI as well, for the AVX-512 tables (whose CPUs need not have AVX-VNNI): every
// block type then takes each 4-byte group straight into the int32 lanes with one vpdpbusd (u8 x
// s8 products summed in fours, exact, unsaturated; dpbusd256) where this build uses vpmaddubsw +
// vpmaddwd, or vpmaddubsw + int16 adds widened later (the K-quants: widened by a vpmaddwd against
// the sub-block scales, which the VNNI build does with a vpmulld on the int32 dot instead); the
// integer dots are the same, so the results are the same bits. The block-type entries are built
// there; the float ones only here.
#include <immintrin.h>

#include "backend/cpu/x86/panel_avx2.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/check.h"
#include "tensor/quant_blocks.h"

#if defined(PAGODA_AVX512VL_VNNI)
#define PAGODA_MATMUL_KERNEL(name) name##_avx512vl
#elif defined(PAGODA_AVXVNNI)
#define PAGODA_MATMUL_KERNEL(name) name##_avxvnni
#else
#define PAGODA_MATMUL_KERNEL(name) name##_avx2
#endif

namespace pagoda::cpu {
namespace {

#if defined(PAGODA_AVXVNNI)
// acc + the sums of each 4-byte group's u8 x s8 products, per int32 lane: the VEX vpdpbusd of
// AVX-VNNI, or the EVEX one of AVX-512 VNNI + VL (the same instruction on 256 bits).
PAGODA_INLINE __m256i dpbusd256(__m256i acc, __m256i u, __m256i s) {
#if defined(PAGODA_AVX512VL_VNNI)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
#endif

// k elements per slice of a batched f32-type product: a panel pair's slice (16 KiB of f32,
// 8 KiB of f16) stays in L1 while every group of input rows passes over it.
constexpr int64_t kFloatSlice = 256;
// Blocks per slice of a batched int8 product: 16 x 32 elements, 4.3 KiB of a q8_0 panel.
constexpr int64_t kBlockSlice = 16;

// Decode streams the weights from memory. The hardware prefetcher alone leaves the int8 loops
// waiting on memory (q8_0 decode on TinyLlama at 16 to 19 tokens/s, 22 to 24 with this); the
// decode loops ask for the lines kPrefetchAhead bytes ahead of what they read. Tuned on Zen 2
// (768 beat 0, 1536 and 2048 for int8; neutral within noise for f16).
constexpr int64_t kPrefetchAhead = 768;
PAGODA_INLINE void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }

// Outputs of panel p of a tile whose first panel has `valid` existing outputs, its panels'
// outputs out_step apart.
PAGODA_INLINE int64_t panel_valid(int64_t valid, int p, int64_t out_step = kPanelRows) { return valid - p * out_step; }

// ---- f32 / f16 / bf16 panels (panel_avx2.h's F32Panel, F16Panel, Bf16Panel) ----

// y[r, out_step p + c] (+)= sum over t < len of x[r, t] * w[panel p's row c, t], for R input
// rows (ldx apart) and P panels (panel_bytes apart, their outputs out_step apart: consecutive
// panels by default), x and the panels starting at the same column; `valid` outputs exist from
// the first panel's first row on. accumulate: continue the running sums already in y. kStream:
// prefetch ahead (decode).
template <class W, int R, int P, bool kStream = false>
PAGODA_INLINE void float_tile(const float* x, int64_t ldx, const uint8_t* panels,
                              int64_t panel_bytes, int64_t len, bool accumulate, float* y,
                              int64_t ldy, int64_t valid, int64_t out_step = kPanelRows) {
  __m256 acc[R][P];
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    unroll<P>([&](auto p) PAGODA_LAMBDA {
      acc[r.value][p.value] = accumulate ? load_out(y + r.value * ldy + p.value * out_step,
                                                    panel_valid(valid, p.value, out_step))
                                         : _mm256_setzero_ps();
    });
  });
  constexpr int64_t kStep = kPanelRows * W::kElemBytes;  // bytes of one column of a panel
  for (int64_t t = 0; t < len; ++t) {
    if constexpr (kStream) {
      if ((t & 3) == 0) {
        unroll<P>([&](auto p) PAGODA_LAMBDA { prefetch(panels + p.value * panel_bytes + t * kStep + kPrefetchAhead); });
      }
    }
    __m256 w[P];
    unroll<P>([&](auto p) PAGODA_LAMBDA { w[p.value] = W::load(panels + p.value * panel_bytes + t * kStep); });
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      const __m256 xv = _mm256_broadcast_ss(x + r.value * ldx + t);
      unroll<P>([&](auto p) PAGODA_LAMBDA {
        acc[r.value][p.value] = _mm256_fmadd_ps(xv, w[p.value], acc[r.value][p.value]);
      });
    });
  }
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    unroll<P>([&](auto p) PAGODA_LAMBDA {
      store_out(y + r.value * ldy + p.value * out_step, acc[r.value][p.value],
                panel_valid(valid, p.value, out_step));
    });
  });
}

constexpr int kFloatRows = 6;  // input rows per batched tile: 6 x 2 accumulators, 2 weights, 1 input
// Up to this many input rows, a product streams the weights once per kFloatRows rows instead of
// converting L1 slices for all rows (Zen 3, TinyLlama f16: 8 rows 0.24 -> 0.13 s a step, 2 rows
// 0.20 -> 0.067 s, where 1 row takes 0.062 s).
constexpr int64_t kStreamRows = 3 * kFloatRows;

// R input rows against one or two panels (num_panels) over one k slice.
template <class W, int R>
PAGODA_INLINE void float_slice(const float* x, int64_t ldx, const uint8_t* panels,
                               int64_t panel_bytes, int64_t num_panels, int64_t len,
                               bool accumulate, float* y, int64_t ldy, int64_t valid) {
  if (num_panels == 2) {
    float_tile<W, R, 2>(x, ldx, panels, panel_bytes, len, accumulate, y, ldy, valid);
  } else {
    float_tile<W, R, 1>(x, ldx, panels, panel_bytes, len, accumulate, y, ldy, valid);
  }
}

// Every group of input rows over one k slice of one or two panels (P = W's panels or f32 ones).
template <class P>
PAGODA_INLINE void float_slice_all_rows(const float* x, int64_t m, int64_t k, const uint8_t* panels,
                                        int64_t panel_bytes, int64_t num_panels, int64_t len,
                                        bool accumulate, float* y, int64_t ldy, int64_t valid) {
  for (int64_t i = 0; i < m; i += kFloatRows) {
    const float* xi = x + i * k;
    float* yi = y + i * ldy;
    const auto args = [&]<int R>() {
      float_slice<P, R>(xi, k, panels, panel_bytes, num_panels, len, accumulate, yi, ldy, valid);
    };
    switch (min64(m - i, kFloatRows)) {
      case 1: args.template operator()<1>(); break;
      case 2: args.template operator()<2>(); break;
      case 3: args.template operator()<3>(); break;
      case 4: args.template operator()<4>(); break;
      case 5: args.template operator()<5>(); break;
      default: args.template operator()<6>(); break;
    }
  }
}

template <class W>
PAGODA_FLATTEN void float_rows(const float* x, int64_t m, int64_t k, const uint8_t* panels, int64_t n, float* y,
                int64_t ldy, int64_t p0, int64_t p1) {
  const int64_t panel_bytes = k * kPanelRows * W::kElemBytes;
  constexpr int64_t kStep = kPanelRows * W::kElemBytes;
  if (m == 1) {
    // Decode: bound by the weight stream. Four panels at once, each through all of k: four
    // independent FMA chains, every weight byte read once, front to back.
    int64_t p = decode_runs<4>(p0, p1, [&](int64_t q, int64_t run) PAGODA_LAMBDA {
      float_tile<W, 1, 4, true>(x, k, panels + q * panel_bytes, run * panel_bytes, k, false, y + q * kPanelRows, ldy,
                                n - q * kPanelRows, run * kPanelRows);
    });
    for (; p < p1; ++p) {
      float_tile<W, 1, 1, true>(x, k, panels + p * panel_bytes, panel_bytes, k, false, y + p * kPanelRows, ldy,
                                n - p * kPanelRows);
    }
    return;
  }
  if (m <= kStreamRows) {
    // A few rows (speculative verification, small batches): as decode, each panel through all
    // of k, every weight converted once per group of up to kFloatRows rows. R x P chains of FMAs
    // (4 cycles' latency, 2 a cycle) keep the units busy from 8 on: 3 rows take 3 panels (on 2,
    // 6 chains, they ran from the cache at 1.06x the speed of 4 rows on Zen 3; on 3, at 1.05 to
    // 1.3x the speed on 2), every tile within the 16 registers.
    for (int64_t i = 0; i < m; i += kFloatRows) {
      const float* xi = x + i * k;
      float* yi = y + i * ldy;
      const auto rows = [&]<int R, int P>() {
        int64_t p = decode_runs<P>(p0, p1, [&](int64_t q, int64_t run) PAGODA_LAMBDA {
          float_tile<W, R, P, true>(xi, k, panels + q * panel_bytes, run * panel_bytes, k, false, yi + q * kPanelRows,
                                    ldy, n - q * kPanelRows, run * kPanelRows);
        });
        for (; p < p1; ++p) {
          float_tile<W, R, 1, true>(xi, k, panels + p * panel_bytes, panel_bytes, k, false, yi + p * kPanelRows, ldy,
                                    n - p * kPanelRows);
        }
      };
      switch (min64(m - i, kFloatRows)) {
        case 1: rows.template operator()<1, 4>(); break;
        case 2: rows.template operator()<2, 4>(); break;
        case 3: rows.template operator()<3, 3>(); break;
        case 4: rows.template operator()<4, 2>(); break;
        case 5: rows.template operator()<5, 2>(); break;
        default: rows.template operator()<6, 2>(); break;
      }
    }
    return;
  }
  // Batched: a k slice of a panel pair stays in L1 while every group of input rows passes over
  // it. f16 / bf16 slices are first converted to f32 (exactly), once instead of once per group.
  alignas(32) float converted[2][kFloatSlice * kPanelRows];  // 16 KiB
  for (int64_t t0 = 0; t0 < k; t0 += kFloatSlice) {
    const int64_t len = min64(k, t0 + kFloatSlice) - t0;
    const bool accumulate = t0 > 0;
    for (int64_t p = p0; p < p1; p += 2) {
      const int64_t num_panels = min64(p1 - p, 2);
      const uint8_t* slice = panels + p * panel_bytes + t0 * kStep;
      float* yp = y + p * kPanelRows;
      const int64_t valid = n - p * kPanelRows;
      if constexpr (W::kElemBytes == 4) {
        float_slice_all_rows<W>(x + t0, m, k, slice, panel_bytes, num_panels, len, accumulate, yp,
                                ldy, valid);
      } else {
        for (int64_t q = 0; q < num_panels; ++q) {
          for (int64_t t = 0; t < len; ++t) {
            _mm256_store_ps(converted[q] + t * kPanelRows, W::load(slice + q * panel_bytes + t * kStep));
          }
        }
        float_slice_all_rows<F32Panel>(x + t0, m, k, reinterpret_cast<const uint8_t*>(converted),
                                       sizeof(converted[0]), num_panels, len, accumulate, yp, ldy,
                                       valid);
      }
    }
  }
}

// ---- q8_0 and the nibble types: per 32-element block, 8 fp16 scales (row order), then the weights ----
//
// q8_0: 8 groups g of 32 bytes, each the 4 int8 weights [4g, 4g + 4) of rows 0..7.
// vpmaddubsw multiplies unsigned by signed bytes, so the weights go in as |w| and the inputs as
// x with w's sign: |w| * (x sign w) = w * x, pairs at most 2 x 128 x 127, no saturation; vpmaddwd
// widens each group's pairs to int32 before they are summed.
struct Q8Panel {
  static constexpr int64_t kBlockBytes = 16 + 8 * kQuantBlock;
  static constexpr bool kHasMin = false;
  template <int R>
  static PAGODA_INLINE void dots(const uint8_t* blk, const BlockQ8Act* const* xb, const int32_t*,
                                 __m256i (&dot)[R]) {
    unroll<R>([&](auto r) PAGODA_LAMBDA { dot[r.value] = _mm256_setzero_si256(); });
    unroll<8>([&](auto g) PAGODA_LAMBDA {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * g.value));
      const __m256i abs_w = _mm256_abs_epi8(w);
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        const __m256i xv = _mm256_sign_epi8(_mm256_set1_epi32(load_i32(xb[r.value]->qs + 4 * g.value)), w);
#if defined(PAGODA_AVXVNNI)
        dot[r.value] = dpbusd256(dot[r.value], abs_w, xv);
#else
        dot[r.value] = _mm256_add_epi32(dot[r.value], _mm256_madd_epi16(_mm256_maddubs_epi16(abs_w, xv), _mm256_set1_epi16(1)));
#endif
      });
    });
  }
};

// Shifts each byte of v so that its bit `from` lands on bit `to` (other bits: masked off by the
// caller). 16-bit shifts: bits that cross into the neighbouring byte land elsewhere than `to`
// when both are bit numbers of a byte (0..7).
template <int kFrom, int kTo>
PAGODA_INLINE __m256i move_bit(__m256i v) {
  static_assert(kFrom >= 0 && kFrom < 8 && kTo >= 0 && kTo < 8);
  if constexpr (kFrom < kTo) return _mm256_slli_epi16(v, kTo - kFrom);
  else if constexpr (kFrom > kTo) return _mm256_srli_epi16(v, kFrom - kTo);
  else return v;
}

// q4_0 / q4_1 / q5_0 / q5_1 ("nibble panels"): per block, the 8 rows' fp16 d (16 bytes), for
// q4_1 / q5_1 their fp16 m (16 bytes), for q5_0 / q5_1 their fifth bits (32 bytes, row c's 4
// bytes at 4c, see below), then 4 groups h of 32 bytes, byte (h, c, j) holding row c's nibbles
// n[4h + j] (low) and n[16 + 4h + j] (high): the type's own qs byte 4h + j. The codes v (the
// nibble, plus 16 x the fifth bit) go in unsigned: sum v * x, pairs at most 2 x 31 x 127; q4's
// eight pair sums of a block add in int16 (at most 30480) before widening, q5's four at a time.
// The offset is taken off after: sum (v - off) * x = sum v * x - off * sum x (q4_0: 8, q5_0: 16);
// q4_1 / q5_1 (w = d * v + m) instead take m * (the block's input sum) as QuantChunk's mins.
// Fifth bits: byte j of row c's word holds, at bit 2h, element 4h + j's bit and, at bit 2h + 1,
// element 16 + 4h + j's, so group h's two fifth-bit vectors are one shift and mask each.
template <bool kMin, bool kFifth, int kOffset>
struct NibblePanel : NibblePanelLayout<kMin, kFifth> {
  using NibblePanelLayout<kMin, kFifth>::kFifthAt;
  using NibblePanelLayout<kMin, kFifth>::kCodesAt;
  static constexpr bool kHasMin = kMin;
  template <int R>
  static PAGODA_INLINE void dots(const uint8_t* blk, const BlockQ8Act* const* xb,
                                 const int32_t* x_sums, __m256i (&dot)[R]) {
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    __m256i fifth = _mm256_setzero_si256();
    if constexpr (kFifth) fifth = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kFifthAt));
#if !defined(PAGODA_AVXVNNI)
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i sum16[R];
    unroll<R>([&](auto r) PAGODA_LAMBDA { sum16[r.value] = _mm256_setzero_si256(); });
#endif
    unroll<R>([&](auto r) PAGODA_LAMBDA { dot[r.value] = _mm256_setzero_si256(); });
    unroll<4>([&](auto h) PAGODA_LAMBDA {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + kCodesAt + 32 * h.value));
      __m256i lo = _mm256_and_si256(bytes, low4);
      __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
      if constexpr (kFifth) {
        const __m256i bit4 = _mm256_set1_epi8(0x10);
        lo = _mm256_or_si256(lo, _mm256_and_si256(move_bit<2 * h.value, 4>(fifth), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(move_bit<2 * h.value + 1, 4>(fifth), bit4));
      }
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        const __m256i x_lo = _mm256_set1_epi32(load_i32(xb[r.value]->qs + 4 * h.value));
        const __m256i x_hi = _mm256_set1_epi32(load_i32(xb[r.value]->qs + 16 + 4 * h.value));
#if defined(PAGODA_AVXVNNI)
        dot[r.value] = dpbusd256(dpbusd256(dot[r.value], lo, x_lo), hi, x_hi);
#else
        sum16[r.value] = _mm256_add_epi16(
            sum16[r.value],
            _mm256_add_epi16(_mm256_maddubs_epi16(lo, x_lo), _mm256_maddubs_epi16(hi, x_hi)));
#endif
      });
#if !defined(PAGODA_AVXVNNI)
      if constexpr (kFifth && h.value % 2 == 1) {  // widen every two groups: 4 x 7874 fits int16
        unroll<R>([&](auto r) PAGODA_LAMBDA {
          dot[r.value] = _mm256_add_epi32(dot[r.value], _mm256_madd_epi16(sum16[r.value], ones));
          sum16[r.value] = _mm256_setzero_si256();
        });
      }
#endif
    });
    unroll<R>([&](auto r) PAGODA_LAMBDA {
#if !defined(PAGODA_AVXVNNI)
      if constexpr (!kFifth) dot[r.value] = _mm256_madd_epi16(sum16[r.value], ones);
#endif
      if constexpr (kOffset != 0) {
        dot[r.value] = _mm256_sub_epi32(dot[r.value], _mm256_set1_epi32(kOffset * x_sums[r.value]));
      }
    });
  }
};
using Q4Panel = NibblePanel<false, false, 8>;
using Q41Panel = NibblePanel<true, false, 0>;
using Q50Panel = NibblePanel<false, true, 16>;
using Q51Panel = NibblePanel<true, true, 0>;

// The block's step of an output's running sum, QuantChunk's order: acc + float(dot) * (d_w * d_x),
// then for the types with an offset m, acc - float(X) * (dmin * d_x) with dmin = -m and X the
// block's input sum, written as acc + float(X) * (m * d_x) (the same rounding: IEEE negation is
// exact).
template <class W>
PAGODA_INLINE __m256 block_step(const uint8_t* blk, __m256 acc, __m256i dot, float d_x, int32_t x_sum) {
  const __m256 dx = _mm256_set1_ps(d_x);
  const __m256 d_w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk)));
  acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(d_w, dx)));
  if constexpr (W::kHasMin) {
    const __m256 m_w = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + W::kMinAt)));
    acc = _mm256_add_ps(acc, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_set1_epi32(x_sum)), _mm256_mul_ps(m_w, dx)));
  }
  return acc;
}

// y[r, c] (+)= sum over blocks [b0, b1) of float(dot) * (d_w * d_x) for R input rows (row r's
// blocks at x + r * nb, block sums at x_sums + r * nb) and one panel (valid outputs).
template <class W, int R>
PAGODA_INLINE void quant_tile(const BlockQ8Act* x, const int32_t* x_sums, int64_t nb,
                              const uint8_t* panel, int64_t b0, int64_t b1, bool accumulate,
                              float* y, int64_t ldy, int64_t valid) {
  __m256 acc[R];
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    acc[r.value] = accumulate ? load_out(y + r.value * ldy, valid) : _mm256_setzero_ps();
  });
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = panel + b * W::kBlockBytes;
    const BlockQ8Act* xb[R];
    int32_t sums[R];
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      xb[r.value] = x + r.value * nb + b;
      sums[r.value] = x_sums == nullptr ? 0 : x_sums[r.value * nb + b];
    });
    __m256i dot[R];
    W::template dots<R>(blk, xb, sums, dot);
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      acc[r.value] = block_step<W>(blk, acc[r.value], dot[r.value], xb[r.value]->d, sums[r.value]);
    });
  }
  unroll<R>([&](auto r) PAGODA_LAMBDA { store_out(y + r.value * ldy, acc[r.value], valid); });
}

// Decode and a few rows: y[r, c] for R input rows (row r's blocks at x + r * nb, block sums at
// x_sums + r * nb, outputs at y + r * ldy) and P panels at once (panel_bytes apart, their outputs
// out_step apart), each panel streamed front to back through all nb blocks: R x P independent
// chains, P streams in flight, the weights unpacked once for all R rows.
template <class W, int R, int P>
PAGODA_INLINE void quant_decode_panels(const BlockQ8Act* x, const int32_t* x_sums, int64_t nb,
                                       const uint8_t* panels, int64_t panel_bytes, float* y, int64_t ldy,
                                       int64_t valid, int64_t out_step) {
  __m256 acc[R][P];
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    unroll<P>([&](auto p) PAGODA_LAMBDA { acc[r.value][p.value] = _mm256_setzero_ps(); });
  });
  for (int64_t b = 0; b < nb; ++b) {
    const BlockQ8Act* xb[R];
    int32_t sums[R];
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      xb[r.value] = x + r.value * nb + b;
      sums[r.value] = x_sums == nullptr ? 0 : x_sums[r.value * nb + b];
    });
    unroll<P>([&](auto p) PAGODA_LAMBDA {
      const uint8_t* blk = panels + p.value * panel_bytes + b * W::kBlockBytes;
      for (int64_t o = 0; o < W::kBlockBytes; o += 64) prefetch(blk + kPrefetchAhead + o);
      __m256i dot[R];
      W::template dots<R>(blk, xb, sums, dot);
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        acc[r.value][p.value] = block_step<W>(blk, acc[r.value][p.value], dot[r.value], xb[r.value]->d, sums[r.value]);
      });
    });
  }
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    unroll<P>([&](auto p) PAGODA_LAMBDA {
      store_out(y + r.value * ldy + p.value * out_step, acc[r.value][p.value], valid - p.value * out_step);
    });
  });
}

constexpr int kQuantRows = 4;  // input rows per batched tile
constexpr int kQuantDecodePanels = 4;

template <class W>
PAGODA_FLATTEN void quant_rows(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t nb,
                const uint8_t* panels, int64_t n, float* y, int64_t ldy, int64_t p0, int64_t p1) {
  const int64_t panel_bytes = nb * W::kBlockBytes;
  if (m <= kQuantRows) {
    // Decode, and a few rows (speculative verification, a draft's catch-up): each panel streams
    // once through all its blocks, a few panels at a time and prefetched, as in decode, instead
    // of slice by slice across the panels (q4_0, 2 rows on Zen 3: 0.57 -> 0.82 of the memory's
    // read, 1 row 0.93; from the cache the integer work per row binds). Tiles within the 16
    // registers: 2 and 3 rows take 2 panels, 4 rows one.
    const auto rows = [&]<int R, int P>() {
      int64_t p = decode_runs<P>(p0, p1, [&](int64_t q, int64_t run) PAGODA_LAMBDA {
        quant_decode_panels<W, R, P>(x, x_sums, nb, panels + q * panel_bytes, run * panel_bytes, y + q * kPanelRows,
                                     ldy, n - q * kPanelRows, run * kPanelRows);
      });
      for (; p < p1; ++p) {
        quant_decode_panels<W, R, 1>(x, x_sums, nb, panels + p * panel_bytes, panel_bytes, y + p * kPanelRows, ldy,
                                     n - p * kPanelRows, kPanelRows);
      }
    };
    switch (m) {
      case 1: rows.template operator()<1, kQuantDecodePanels>(); break;
      case 2: rows.template operator()<2, 2>(); break;
      case 3: rows.template operator()<3, 2>(); break;
      default: rows.template operator()<4, 1>(); break;
    }
    return;
  }
  for (int64_t b0 = 0; b0 < nb; b0 += kBlockSlice) {
    const int64_t b1 = min64(nb, b0 + kBlockSlice);
    const bool accumulate = b0 > 0;
    for (int64_t p = p0; p < p1; ++p) {
      const uint8_t* panel = panels + p * panel_bytes;
      const int64_t valid = n - p * kPanelRows;
      for (int64_t i = 0; i < m; i += kQuantRows) {
        const BlockQ8Act* xi = x + i * nb;
        const int32_t* si = x_sums == nullptr ? nullptr : x_sums + i * nb;
        float* yi = y + i * ldy + p * kPanelRows;
        switch (min64(m - i, kQuantRows)) {
          case 1: quant_tile<W, 1>(xi, si, nb, panel, b0, b1, accumulate, yi, ldy, valid); break;
          case 2: quant_tile<W, 2>(xi, si, nb, panel, b0, b1, accumulate, yi, ldy, valid); break;
          case 3: quant_tile<W, 3>(xi, si, nb, panel, b0, b1, accumulate, yi, ldy, valid); break;
          default: quant_tile<W, 4>(xi, si, nb, panel, b0, b1, accumulate, yi, ldy, valid); break;
        }
      }
    }
  }
}

// Super-blocks ahead that the K-quant decode loops prefetch.
constexpr int64_t kK4PrefetchBlocks = 2;

// ---- q4_k / q5_k panels multiplied as they lie (x86_kernels.h) ----
//
// The codes are unsigned (q4_k's nibbles; q5_k's with the fifth bit from the qh run, 0..31), so
// vpmaddubsw takes them against the input as they are. Per chunk (sub-block) s of a super-block
// and row: D = the integer dot, summed in int16 across the chunk's groups (q4_k: 8 x 3810 fits;
// q5_k: widened after 4 groups, 4 x 7874), then widened by vpmaddwd against the chunk's scale in
// both int16 halves of the lane, which gives I = sc * D directly; M = mn * (the input block's
// sum), also one vpmaddwd (the sum, at most 32 x 127, fits int16). Then acc + float(I) * (d *
// d_x) and acc - float(M) * (dmin * d_x): with sc0 = sc1 and mn0 = mn1 (32-element sub-blocks)
// exactly QuantChunk's integers and order, so bit for bit the reference. A tile is R input rows x
// P panels (decode: one row, P panels streamed side by side). The VNNI build sums D in int32 by
// vpdpbusd and takes I = sc * D by vpmulld.
template <bool kFifth>
struct K4Layout {
  static constexpr int64_t kQhAt = 1024;
  static constexpr int64_t kScalesAt = 1024 + (kFifth ? 256 : 0);
  static constexpr int64_t kMinsAt = kScalesAt + 64, kDAt = kScalesAt + 128, kDminAt = kScalesAt + 144;
  static constexpr int64_t kBlockBytes = kScalesAt + 160;
};
static_assert(K4Layout<false>::kBlockBytes == kQ4KPanelBlockBytes && K4Layout<true>::kBlockBytes == kQ5KPanelBlockBytes);

PAGODA_INLINE __m128i load8(const uint8_t* p) { return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)); }

// The 8 rows' uint8 scales at p as int16 pairs (s_c, s_c), lane c: vpmaddwd's second operand.
PAGODA_INLINE __m256i scale_pairs_u8(const uint8_t* p) {
  const __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(v, v));
}

// Chunk pair kPair (chunks 2 kPair, low nibbles, and 2 kPair + 1, high) of super-block b of one
// panel (at `block`) for R input rows: acc[r] += the two chunks' steps.
template <int R, bool kFifth, int kPair>
PAGODA_INLINE void k4_pair(const BlockQ8Act* x, const int32_t* x_sums, int64_t nb, const uint8_t* block, int64_t b,
                           __m256 (&acc)[R]) {
  using L = K4Layout<kFifth>;
  const __m256i low4 = _mm256_set1_epi8(0x0f), bit4 = _mm256_set1_epi8(0x10);
  const int64_t c0 = 8 * b + 2 * kPair;  // the input block of chunk 2 kPair
  __m256i dot[2][R];
  // Chunk 2 kPair's codes in group g (lo) and chunk 2 kPair + 1's (hi), with q5_k's fifth bits.
  auto codes = [&](auto g, __m256i& lo, __m256i& hi) PAGODA_LAMBDA {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 256 * kPair + 32 * g.value));
    lo = _mm256_and_si256(v, low4);
    hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    if constexpr (kFifth) {  // chunk s's fifth bit is bit s of the qh byte
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + L::kQhAt + 32 * g.value));
      lo = _mm256_or_si256(lo, _mm256_and_si256(move_bit<2 * kPair, 4>(qh), bit4));
      hi = _mm256_or_si256(hi, _mm256_and_si256(move_bit<2 * kPair + 1, 4>(qh), bit4));
    }
  };
  auto inputs = [&](auto g, __m256i (&xl)[R], __m256i (&xh)[R]) PAGODA_LAMBDA {
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      xl[r.value] = _mm256_set1_epi32(load_i32(x[r.value * nb + c0].qs + 4 * g.value));
      xh[r.value] = _mm256_set1_epi32(load_i32(x[r.value * nb + c0 + 1].qs + 4 * g.value));
    });
  };
#if defined(PAGODA_AVXVNNI)
  // vpdpbusd sums each group's products straight into the int32 lanes (D, at most 32 x 31 x
  // 127); then I = sc * D, one vpmulld.
  __m256i d32[2][R];
  unroll<2>([&](auto h) PAGODA_LAMBDA {
    unroll<R>([&](auto r) PAGODA_LAMBDA { d32[h.value][r.value] = _mm256_setzero_si256(); });
  });
  unroll<8>([&](auto g) PAGODA_LAMBDA {
    __m256i xl[R], xh[R], lo, hi;
    inputs(g, xl, xh);
    codes(g, lo, hi);
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      d32[0][r.value] = dpbusd256(d32[0][r.value], lo, xl[r.value]);
      d32[1][r.value] = dpbusd256(d32[1][r.value], hi, xh[r.value]);
    });
  });
  unroll<2>([&](auto h) PAGODA_LAMBDA {
    const __m256i sc = _mm256_cvtepu8_epi32(load8(block + L::kScalesAt + 8 * (2 * kPair + h.value)));
    unroll<R>([&](auto r) PAGODA_LAMBDA { dot[h.value][r.value] = _mm256_mullo_epi32(d32[h.value][r.value], sc); });
  });
#else
  __m256i sum16[2][R];
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    unroll<2>([&](auto h) PAGODA_LAMBDA { sum16[h.value][r.value] = _mm256_setzero_si256(); });
  });
  // sum16 -> dot (first: set, else add), scaled: vpmaddwd against each chunk's scale pairs.
  auto widen = [&](auto first) PAGODA_LAMBDA {
    unroll<2>([&](auto h) PAGODA_LAMBDA {
      const __m256i sc = scale_pairs_u8(block + L::kScalesAt + 8 * (2 * kPair + h.value));
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        __m256i& s16 = sum16[h.value][r.value];
        __m256i& d = dot[h.value][r.value];
        d = first.value ? _mm256_madd_epi16(s16, sc) : _mm256_add_epi32(d, _mm256_madd_epi16(s16, sc));
        s16 = _mm256_setzero_si256();
      });
    });
  };
  unroll<8>([&](auto g) PAGODA_LAMBDA {
    __m256i xl[R], xh[R], lo, hi;
    inputs(g, xl, xh);
    codes(g, lo, hi);
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      sum16[0][r.value] = _mm256_add_epi16(sum16[0][r.value], _mm256_maddubs_epi16(lo, xl[r.value]));
      sum16[1][r.value] = _mm256_add_epi16(sum16[1][r.value], _mm256_maddubs_epi16(hi, xh[r.value]));
    });
    if constexpr (kFifth && g.value == 3) widen(Idx<1>{});
  });
  widen(Idx<kFifth ? 0 : 1>{});
#endif
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + L::kDAt)));
  const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + L::kDminAt)));
  unroll<2>([&](auto h) PAGODA_LAMBDA {
    const int s = 2 * kPair + h.value;
    const __m256i mn = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + L::kMinsAt + 8 * s)));
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      const int64_t c = c0 + h.value;
      const __m256 d_x = _mm256_set1_ps(x[r.value * nb + c].d);
      __m256& a = acc[r.value];
      a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_cvtepi32_ps(dot[h.value][r.value]), _mm256_mul_ps(d, d_x)));
      const __m256i mins = _mm256_madd_epi16(mn, _mm256_set1_epi32(x_sums[r.value * nb + c] & 0xffff));
      a = _mm256_sub_ps(a, _mm256_mul_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, d_x)));
    });
  });
}

// R input rows x P panels (panel_bytes apart, their outputs out_step apart); decode (R = 1)
// streams the P panels side by side, one chunk pair of each in turn. A pair is finished for one
// panel before the next panel's starts: with the panels' groups interleaved instead (sharing
// the input broadcasts), engine decode was 21% (q4_k) and 29% (q5_k) slower on a Zen 3, though
// the tile was about 14% and 5% faster from the cache (docs/benchmarks.md, "q4_k / q5_k decode").
template <int R, int P, bool kFifth>
PAGODA_INLINE void k4_tile(const BlockQ8Act* x, const int32_t* x_sums, int64_t nb, const uint8_t* panels,
                           int64_t panel_bytes, int64_t num_blocks, float* y, int64_t ldy, int64_t valid,
                           int64_t out_step) {
  using L = K4Layout<kFifth>;
  __m256 acc[P][R];
  unroll<P>([&](auto p) PAGODA_LAMBDA { unroll<R>([&](auto r) PAGODA_LAMBDA { acc[p.value][r.value] = _mm256_setzero_ps(); }); });
  for (int64_t b = 0; b < num_blocks; ++b) {
    unroll<4>([&](auto pair) PAGODA_LAMBDA {
      unroll<P>([&](auto p) PAGODA_LAMBDA {
        const uint8_t* block = panels + p.value * panel_bytes + b * L::kBlockBytes;
        if constexpr (R == 1) {
          // Decode streams the panels: ask for this pair's 4 lines of codes and 2 of what follows
          // them (qh, scales) of the block kK4PrefetchBlocks ahead, a few at a time, not in a burst.
          const uint8_t* ahead = block + kK4PrefetchBlocks * L::kBlockBytes;
          unroll<4>([&](auto line) PAGODA_LAMBDA { prefetch(ahead + 256 * pair.value + 64 * line.value); });
          unroll<2>([&](auto line) PAGODA_LAMBDA {
            constexpr int64_t at = 1024 + 128 * pair.value + 64 * line.value;
            if constexpr (at < L::kBlockBytes) prefetch(ahead + at);
          });
        }
        // Each panel loads its own inputs: otherwise GCC keeps the first panel's 16 input
        // broadcasts live for the second and spills them. The empty asm hides that xp == x.
        const BlockQ8Act* xp = x;
        if constexpr (P > 1) asm volatile("" : "+r"(xp));
        k4_pair<R, kFifth, decltype(pair)::value>(xp, x_sums, nb, block, b, acc[p.value]);
      });
    });
  }
  unroll<P>([&](auto p) PAGODA_LAMBDA {
    unroll<R>([&](auto r) PAGODA_LAMBDA { store_out(y + r.value * ldy + p.value * out_step, acc[p.value][r.value], valid - p.value * out_step); });
  });
}

// The same for q6_k panels: the 6-bit codes assembled from their runs are q + 32, unsigned, so
// vpmaddubsw takes them as they are; each 16-element half's dot is then D = dot(q + 32, x) -
// 32 * (the half's input sum), exactly QuantChunk's, and I = sc0 * D0 + sc1 * D1 (no mins).
//
// q6_k_block: super-block b (at `block`) of one panel for R input rows, acc[r] += its 8 chunks'
// steps; q6_k_tile: all of a panel's super-blocks; q6_k_decode_panels: one input row against P
// panels side by side, a super-block of each in turn (P weight streams in flight; each panel's
// outputs the steps of q6_k_tile<1>).
template <int R>
PAGODA_INLINE void q6_k_block(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t nb, const uint8_t* block,
                              int64_t b, __m256 (&acc)[R]) {
  const __m256i low4 = _mm256_set1_epi8(0x0f), bits45 = _mm256_set1_epi8(0x30);
#if !defined(PAGODA_AVXVNNI)
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 1664)));
  for (int h = 0; h < 2; ++h) {  // chunks 4h + t, t < 4
    __m256i dot[4][2][R];       // [t][half of the chunk][row]
    unroll<4>([&](auto t) PAGODA_LAMBDA {
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        dot[t.value][0][r.value] = _mm256_setzero_si256();
        dot[t.value][1][r.value] = _mm256_setzero_si256();
      });
    });
    const int64_t c0 = 8 * b + 4 * h;  // the input block of chunk 4h
    unroll<8>([&](auto g) PAGODA_LAMBDA {
      const uint8_t* at = block + 768 * h + 32 * g.value;
      if constexpr (R == 1) {  // decode: two lines per group of the block kK4PrefetchBlocks ahead
        const uint8_t* ahead = block + kK4PrefetchBlocks * kQ6KPanelBlockBytes + 128 * (8 * h + g.value);
        prefetch(ahead);
        if (ahead + 64 < block + (kK4PrefetchBlocks + 1) * kQ6KPanelBlockBytes) prefetch(ahead + 64);
      }
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 256));
      const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(at + 512));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4), bits45)),
          _mm256_or_si256(_mm256_and_si256(l1, low4), _mm256_and_si256(_mm256_slli_epi16(hb, 2), bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4), _mm256_and_si256(hb, bits45)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                          _mm256_and_si256(_mm256_srli_epi16(hb, 2), bits45))};
      constexpr int half = g.value / 4;
      unroll<4>([&](auto t) PAGODA_LAMBDA {
        unroll<R>([&](auto r) PAGODA_LAMBDA {
          const __m256i xv = _mm256_set1_epi32(load_i32(x[r.value * nb + c0 + t.value].qs + 4 * g.value));
          __m256i& acc_dot = dot[t.value][half][r.value];
#if defined(PAGODA_AVXVNNI)
          acc_dot = dpbusd256(acc_dot, q[t.value], xv);
#else
          acc_dot = _mm256_add_epi32(acc_dot, _mm256_madd_epi16(_mm256_maddubs_epi16(q[t.value], xv), ones));
#endif
        });
      });
    });
    unroll<4>([&](auto t) PAGODA_LAMBDA {
      const int s = 4 * h + t.value;
      const __m256i sc0 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 1536 + 16 * s)));
      const __m256i sc1 = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(block + 1544 + 16 * s)));
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        const int64_t c = c0 + t.value;
        const int32_t* hs = x_half_sums + 2 * (r.value * nb + c);
        const __m256i d0 = _mm256_sub_epi32(dot[t.value][0][r.value], _mm256_set1_epi32(32 * hs[0]));
        const __m256i d1 = _mm256_sub_epi32(dot[t.value][1][r.value], _mm256_set1_epi32(32 * hs[1]));
        const __m256i ints = _mm256_add_epi32(_mm256_mullo_epi32(sc0, d0), _mm256_mullo_epi32(sc1, d1));
        const __m256 d_x = _mm256_set1_ps(x[r.value * nb + c].d);
        acc[r.value] = _mm256_add_ps(acc[r.value], _mm256_mul_ps(_mm256_cvtepi32_ps(ints), _mm256_mul_ps(d, d_x)));
      });
    });
  }
}

template <int R>
PAGODA_INLINE void q6_k_tile(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t nb, const uint8_t* panel,
                             int64_t num_blocks, float* y, int64_t ldy, int64_t valid) {
  __m256 acc[R];
  unroll<R>([&](auto r) PAGODA_LAMBDA { acc[r.value] = _mm256_setzero_ps(); });
  for (int64_t b = 0; b < num_blocks; ++b) q6_k_block<R>(x, x_half_sums, nb, panel + b * kQ6KPanelBlockBytes, b, acc);
  unroll<R>([&](auto r) PAGODA_LAMBDA { store_out(y + r.value * ldy, acc[r.value], valid); });
}

template <int P>
PAGODA_INLINE void q6_k_decode_panels(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t nb,
                                      const uint8_t* panels, int64_t panel_bytes, int64_t num_blocks, float* y,
                                      int64_t valid, int64_t out_step) {
  __m256 acc[P][1];
  unroll<P>([&](auto p) PAGODA_LAMBDA { acc[p.value][0] = _mm256_setzero_ps(); });
  for (int64_t b = 0; b < num_blocks; ++b) {
    unroll<P>([&](auto p) PAGODA_LAMBDA {
      q6_k_block<1>(x, x_half_sums, nb, panels + p.value * panel_bytes + b * kQ6KPanelBlockBytes, b, acc[p.value]);
    });
  }
  unroll<P>([&](auto p) PAGODA_LAMBDA {
    store_out(y + p.value * out_step, acc[p.value][0], valid - p.value * out_step);
  });
}

// ---- q2_k / q3_k panels multiplied as they lie (x86_kernels.h) ----
//
// Chunk c (32 elements) of a super-block takes its 2-bit codes from code run c / 4 at shift
// 2 (c % 4); q3_k adds 4 x bit c of the hmask byte, so the codes u go in unsigned (q2_k's q in
// 0..3; q3_k's u = q + 4 in 0..7). Each 16-element half (sub-block) sums in int16 over its 4
// groups (at most 4 x 1778), widened by vpmaddwd against the sub-block's scale: I = sc0 * D0 +
// sc1 * D1 with q3_k's offset taken off as 4 (sc0 X0 + sc1 X1) (X: the halves' input sums), and
// q2_k's M = mn0 X0 + mn1 X1, each one vpmaddwd of (s0, s1) pairs against (X0, X1). Then
// QuantChunk's steps in its order (tensor/quant_blocks.h): bit for bit the reference. The VNNI
// build sums each half in int32 by vpdpbusd and multiplies it by its scale with vpmulld.
template <bool kQ3>
struct K16Layout {
  static constexpr int64_t kHmaskAt = 512;                  // q3_k
  static constexpr int64_t kScalesAt = kQ3 ? 768 : 512;     // sub-block j of row c at + 8 j + c
  static constexpr int64_t kDAt = kQ3 ? 896 : 640, kDminAt = 656;
  static constexpr int64_t kBlockBytes = kQ3 ? 912 : 672;
};
static_assert(K16Layout<false>::kBlockBytes == kQ2KPanelBlockBytes && K16Layout<true>::kBlockBytes == kQ3KPanelBlockBytes);

// vpshufb controls over q2_k's 16 scale bytes of a chunk (sub-block 2c's 8 rows, then 2c + 1's),
// held in both halves of a vector: lane r (rows 0..3 in the low half, 4..7 in the high one) gets
// bytes a0 + r and a1 + r as int16 (kWide: byte a0 + r as int32), zero-extended (-128: a zero).
struct ShuffleControl {
  alignas(32) int8_t bytes[32];
};
template <int kA0, int kA1, bool kWide>
constexpr ShuffleControl spread_control() {
  ShuffleControl c{};
  for (int r = 0; r < 8; ++r) {
    c.bytes[4 * r] = static_cast<int8_t>(kA0 + r);
    c.bytes[4 * r + 1] = -128;
    c.bytes[4 * r + 2] = kWide ? -128 : static_cast<int8_t>(kA1 + r);
    c.bytes[4 * r + 3] = -128;
  }
  return c;
}
template <int kA0, int kA1, bool kWide>
constexpr ShuffleControl kSpread = spread_control<kA0, kA1, kWide>();
template <int kA0, int kA1, bool kWide>
PAGODA_INLINE __m256i load_spread() {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(kSpread<kA0, kA1, kWide>.bytes));
}

// Decode interleaves the P panels group by group (one chunk of one panel at a time, as k4_tile
// goes, measured mixed here: docs/benchmarks.md, "q4_k / q5_k decode").
template <int R, int P, bool kQ3>
PAGODA_INLINE void k16_tile(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t nb, const uint8_t* panels,
                            int64_t panel_bytes, int64_t num_blocks, float* y, int64_t ldy, int64_t valid,
                            int64_t out_step) {
  using L = K16Layout<kQ3>;
  __m256 acc[P][R];
  unroll<P>([&](auto p) PAGODA_LAMBDA { unroll<R>([&](auto r) PAGODA_LAMBDA { acc[p.value][r.value] = _mm256_setzero_ps(); }); });
  const __m256i low2 = _mm256_set1_epi8(0x03), bit2 = _mm256_set1_epi8(0x04), low4 = _mm256_set1_epi8(0x0f);
#if defined(PAGODA_AVXVNNI)
  constexpr bool kInt32Scales = true;  // vpmulld takes q2_k's scales as int32
#else
  constexpr bool kInt32Scales = false;
#endif
  const __m256i spread_s0 = load_spread<0, 0, kInt32Scales>(), spread_s1 = load_spread<8, 8, kInt32Scales>();
  const __m256i spread_pair = load_spread<0, 8, false>();
  for (int64_t b = 0; b < num_blocks; ++b) {
    const uint8_t* block[P];
    unroll<P>([&](auto p) PAGODA_LAMBDA { block[p.value] = panels + p.value * panel_bytes + b * L::kBlockBytes; });
    unroll<8>([&](auto c) PAGODA_LAMBDA {
      constexpr int a = c.value / 4, t = c.value % 4;
      if constexpr (R == 1) {  // decode: this chunk's share (two lines) of the block kK4PrefetchBlocks ahead
        unroll<P>([&](auto p) PAGODA_LAMBDA {
          const uint8_t* ahead = block[p.value] + kK4PrefetchBlocks * L::kBlockBytes + 128 * c.value;
          prefetch(ahead);
          if (128 * c.value + 64 < L::kBlockBytes) prefetch(ahead + 64);
        });
      }
      const int64_t xc = 8 * b + c.value;  // the input block of chunk c
#if defined(PAGODA_AVXVNNI)
      // Each half's dot straight into the int32 lanes by vpdpbusd.
      __m256i sum32[P][2][R];
      unroll<P>([&](auto p) PAGODA_LAMBDA {
        unroll<2>([&](auto h) PAGODA_LAMBDA { unroll<R>([&](auto r) PAGODA_LAMBDA { sum32[p.value][h.value][r.value] = _mm256_setzero_si256(); }); });
      });
#else
      __m256i sum16[P][2][R];
      unroll<P>([&](auto p) PAGODA_LAMBDA {
        unroll<2>([&](auto h) PAGODA_LAMBDA { unroll<R>([&](auto r) PAGODA_LAMBDA { sum16[p.value][h.value][r.value] = _mm256_setzero_si256(); }); });
      });
#endif
      unroll<8>([&](auto g) PAGODA_LAMBDA {
        __m256i xv[R];
        unroll<R>([&](auto r) PAGODA_LAMBDA { xv[r.value] = _mm256_set1_epi32(load_i32(x[r.value * nb + xc].qs + 4 * g.value)); });
        unroll<P>([&](auto p) PAGODA_LAMBDA {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block[p.value] + 256 * a + 32 * g.value));
          __m256i u = _mm256_and_si256(_mm256_srli_epi16(v, 2 * t), low2);
          if constexpr (kQ3) {
            const __m256i hm =
                _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block[p.value] + L::kHmaskAt + 32 * g.value));
            u = _mm256_or_si256(u, _mm256_and_si256(move_bit<c.value, 2>(hm), bit2));
          }
          unroll<R>([&](auto r) PAGODA_LAMBDA {
#if defined(PAGODA_AVXVNNI)
            __m256i& s32 = sum32[p.value][g.value / 4][r.value];
            s32 = dpbusd256(s32, u, xv[r.value]);
#else
            __m256i& s16 = sum16[p.value][g.value / 4][r.value];
            s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(u, xv[r.value]));
#endif
          });
        });
      });
      unroll<P>([&](auto p) PAGODA_LAMBDA {
        const uint8_t* scales = block[p.value] + L::kScalesAt + 8 * (2 * c.value);
        __m256i sc0, sc1, pairs;  // (s0, s0), (s1, s1) and (s0, s1) int16 pairs per lane (VNNI: sc0, sc1 int32)
        if constexpr (!kQ3) {
          // q2_k: scale in the low nibble, min in the high one; both halves of the vector hold
          // the 16 bytes, and one vpshufb each spreads them (zero-extended) to the lanes.
          const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales)));
          const __m256i sc = _mm256_and_si256(both, low4), mn = _mm256_and_si256(_mm256_srli_epi16(both, 4), low4);
          sc0 = _mm256_shuffle_epi8(sc, spread_s0);
          sc1 = _mm256_shuffle_epi8(sc, spread_s1);
          pairs = _mm256_shuffle_epi8(mn, spread_pair);  // (mn0, mn1)
        } else {  // q3_k: signed scales, (sc0, sc1) for the offset term
          const __m128i s0 = load8(scales), s1 = load8(scales + 8);
#if defined(PAGODA_AVXVNNI)
          sc0 = _mm256_cvtepi8_epi32(s0);
          sc1 = _mm256_cvtepi8_epi32(s1);
#else
          sc0 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s0, s0));
          sc1 = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s1, s1));
#endif
          pairs = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(s0, s1));
        }
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block[p.value] + L::kDAt)));
        unroll<R>([&](auto r) PAGODA_LAMBDA {
          const int32_t* hs = x_half_sums + 2 * (r.value * nb + xc);
          const __m256i x_pair = _mm256_set1_epi32((hs[0] & 0xffff) | static_cast<int32_t>(static_cast<uint32_t>(hs[1]) << 16));
#if defined(PAGODA_AVXVNNI)
          __m256i ints = _mm256_add_epi32(_mm256_mullo_epi32(sum32[p.value][0][r.value], sc0),
                                          _mm256_mullo_epi32(sum32[p.value][1][r.value], sc1));
#else
          __m256i ints = _mm256_add_epi32(_mm256_madd_epi16(sum16[p.value][0][r.value], sc0),
                                          _mm256_madd_epi16(sum16[p.value][1][r.value], sc1));
#endif
          if constexpr (kQ3) ints = _mm256_sub_epi32(ints, _mm256_slli_epi32(_mm256_madd_epi16(pairs, x_pair), 2));
          const __m256 d_x = _mm256_set1_ps(x[r.value * nb + xc].d);
          __m256& out = acc[p.value][r.value];
          out = _mm256_add_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(ints), _mm256_mul_ps(d, d_x)));
          if constexpr (!kQ3) {
            const __m256 dmin =
                _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block[p.value] + L::kDminAt)));
            const __m256i mins = _mm256_madd_epi16(pairs, x_pair);
            out = _mm256_sub_ps(out, _mm256_mul_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dmin, d_x)));
          }
        });
      });
    });
  }
  unroll<P>([&](auto p) PAGODA_LAMBDA {
    unroll<R>([&](auto r) PAGODA_LAMBDA { store_out(y + r.value * ldy + p.value * out_step, acc[p.value][r.value], valid - p.value * out_step); });
  });
}

}  // namespace

#if !defined(PAGODA_AVXVNNI)
void matmul_packed_rows_avx2(const float* x, int64_t m, int64_t k, DType w_type,
                             const void* panels, int64_t n, float* y, int64_t ldy,
                             int64_t panel_begin, int64_t panel_end) {
  const auto* w = static_cast<const uint8_t*>(panels);
  switch (w_type) {
    case DType::kF32:
      return float_rows<F32Panel>(x, m, k, w, n, y, ldy, panel_begin, panel_end);
    case DType::kF16:
      return float_rows<F16Panel>(x, m, k, w, n, y, ldy, panel_begin, panel_end);
    case DType::kBF16:
      return float_rows<Bf16Panel>(x, m, k, w, n, y, ldy, panel_begin, panel_end);
    default:
      break;
  }
  PAGODA_CHECK(false && "matmul_packed_rows_avx2 takes f32, f16 or bf16 panels");
}

#endif  // !PAGODA_AVXVNNI

void PAGODA_MATMUL_KERNEL(matmul_packed_q8act)(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k,
                              DType w_type, const void* panels, int64_t n, float* y, int64_t ldy,
                              int64_t panel_begin, int64_t panel_end) {
  PAGODA_CHECK(k % kQuantBlock == 0);
  const auto* w = static_cast<const uint8_t*>(panels);
  const int64_t nb = k / kQuantBlock;
  if (w_type == DType::kQ8_0) {
    return quant_rows<Q8Panel>(x, nullptr, m, nb, w, n, y, ldy, panel_begin, panel_end);
  }
  PAGODA_CHECK(x_sums != nullptr);
  switch (w_type) {
    case DType::kQ4_0: return quant_rows<Q4Panel>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    case DType::kQ4_1: return quant_rows<Q41Panel>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    case DType::kQ5_0: return quant_rows<Q50Panel>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    case DType::kQ5_1: return quant_rows<Q51Panel>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    default: break;
  }
  PAGODA_CHECK(false && "matmul_packed_q8act_avx2 takes q8_0, q4_0, q4_1, q5_0 or q5_1 panels");
}

#if !defined(PAGODA_AVXVNNI)
PAGODA_FLATTEN void quantize_activation_rows_avx2(const float* x, int64_t m, int64_t k, BlockQ8Act* out) {
  PAGODA_CHECK(k % kQuantBlock == 0);
  const int64_t nb = k / kQuantBlock;
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  // packs_epi32 then packs_epi16 interleave the four vectors by 128-bit lane; this puts the
  // 32-bit groups back in element order.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t b = 0; b < nb; ++b) {
      const float* xb = x + i * k + b * kQuantBlock;
      BlockQ8Act& o = out[i * nb + b];
      __m256 v[4];
      unroll<4>([&](auto s) PAGODA_LAMBDA { v[s.value] = _mm256_loadu_ps(xb + 8 * s.value); });
      __m256 amax = _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[0]), _mm256_andnot_ps(sign_bit, v[1]));
      amax = _mm256_max_ps(amax, _mm256_max_ps(_mm256_andnot_ps(sign_bit, v[2]),
                                               _mm256_andnot_ps(sign_bit, v[3])));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
      const float max_abs = _mm_cvtss_f32(m4);
      const float id = max_abs != 0 ? 127.0f / max_abs : 0.0f;
      o.d = max_abs / 127.0f;
      const __m256 scale = _mm256_set1_ps(id);
      __m256i q[4];
      // cvtps rounds in the default mode, to nearest even: the reference's nearbyint.
      unroll<4>([&](auto s) PAGODA_LAMBDA { q[s.value] = _mm256_cvtps_epi32(_mm256_mul_ps(v[s.value], scale)); });
      const __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.qs), _mm256_permutevar8x32_epi32(q16, order));
    }
  }
}

void activation_block_sums_avx2(const BlockQ8Act* x, int64_t num_blocks, int32_t* sums) {
  const __m256i ones8 = _mm256_set1_epi8(1);
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < num_blocks; ++b) {
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[b].qs));
    const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, q), ones16);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
    sums[b] = _mm_cvtsi128_si32(s4);
  }
}

#endif  // !PAGODA_AVXVNNI

namespace {

// tile(rows, i, p) for input rows [i, i + rows) (tiles of up to kQuantRows, rows a compile-time
// constant) and every panel p of [p0, p1).
template <int kMaxRows = kQuantRows, class Tile>
PAGODA_INLINE void over_row_tiles(int64_t m, int64_t p0, int64_t p1, Tile&& tile) {
  static_assert(kMaxRows == 2 || kMaxRows == 4);
  for (int64_t p = p0; p < p1; ++p) {
    for (int64_t i = 0; i < m; i += kMaxRows) {
      switch (min64(m - i, kMaxRows)) {
        case 1: tile(Idx<1>{}, i, p); break;
        case 2: tile(Idx<2>{}, i, p); break;
        case 3: if constexpr (kMaxRows == 4) tile(Idx<3>{}, i, p); break;
        default: if constexpr (kMaxRows == 4) tile(Idx<4>{}, i, p); break;
      }
    }
  }
}

// q4_k / q5_k and q2_k / q3_k decode: two panels' weight streams at once (four measured no
// better, docs/benchmarks.md).
constexpr int kK4DecodePanels = 2;
// q6_k decode: two panels' weight streams at once (one alone left the loop waiting on memory:
// TinyLlama decode 19.7 against 24.2 tokens/s; four: 22.8).
constexpr int kQ6KDecodePanels = 2;

// tile(rows, panels, i, p, run) over the super-block panels [panel_begin, panel_end): decode
// (m = 1) streams kK4DecodePanels panels side by side (run panels apart, decode_runs),
// the rest goes by input-row tiles of up to kMaxRows, one panel each (run 1).
template <int kMaxRows, class Tile>
PAGODA_INLINE void over_super_block_tiles(int64_t m, int64_t panel_begin, int64_t panel_end, Tile&& tile) {
  if (m == 1) {
    int64_t p = decode_runs<kK4DecodePanels>(panel_begin, panel_end, [&](int64_t q, int64_t run) PAGODA_LAMBDA {
      tile(Idx<1>{}, Idx<kK4DecodePanels>{}, 0, q, run);
    });
    for (; p < panel_end; ++p) tile(Idx<1>{}, Idx<1>{}, 0, p, 1);
    return;
  }
  over_row_tiles<kMaxRows>(m, panel_begin, panel_end,
                           [&](auto rows, int64_t i, int64_t p) PAGODA_LAMBDA { tile(rows, Idx<1>{}, i, p, 1); });
}

template <bool kFifth>
PAGODA_FLATTEN void k4_rows(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k, const void* panels,
                            int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  const int64_t nb = k / kQuantBlock, num_blocks = k / 256;  // 256-element super-blocks
  const int64_t panel_bytes = num_blocks * K4Layout<kFifth>::kBlockBytes;
  const auto* w = static_cast<const uint8_t*>(panels);
  // q5_k's tile holds its widened sums besides the int16 ones: 2 rows keep it in registers.
  over_super_block_tiles<kFifth ? 2 : 4>(m, panel_begin, panel_end, [&](auto rows, auto tile_panels, int64_t i, int64_t p, int64_t run) PAGODA_LAMBDA {
    k4_tile<decltype(rows)::value, decltype(tile_panels)::value, kFifth>(
        x + i * nb, x_sums + i * nb, nb, w + p * panel_bytes, run * panel_bytes, num_blocks, y + i * ldy + p * kPanelRows, ldy,
        n - p * kPanelRows, run * kPanelRows);
  });
}

template <bool kQ3>
PAGODA_FLATTEN void k16_rows(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k, const void* panels,
                             int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  const int64_t nb = k / kQuantBlock, num_blocks = k / 256;
  const int64_t panel_bytes = num_blocks * K16Layout<kQ3>::kBlockBytes;
  const auto* w = static_cast<const uint8_t*>(panels);
  over_super_block_tiles<2>(m, panel_begin, panel_end, [&](auto rows, auto tile_panels, int64_t i, int64_t p, int64_t run) PAGODA_LAMBDA {
    k16_tile<decltype(rows)::value, decltype(tile_panels)::value, kQ3>(
        x + i * nb, x_half_sums + 2 * i * nb, nb, w + p * panel_bytes, run * panel_bytes, num_blocks,
        y + i * ldy + p * kPanelRows, ldy, n - p * kPanelRows, run * kPanelRows);
  });
}

}  // namespace

void PAGODA_MATMUL_KERNEL(matmul_q4_k_panels)(
    const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k, const void* panels, int64_t n, float* y,
    int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  k4_rows<false>(x, x_sums, m, k, panels, n, y, ldy, panel_begin, panel_end);
}

void PAGODA_MATMUL_KERNEL(matmul_q5_k_panels)(
    const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k, const void* panels, int64_t n, float* y,
    int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  k4_rows<true>(x, x_sums, m, k, panels, n, y, ldy, panel_begin, panel_end);
}

PAGODA_FLATTEN void PAGODA_MATMUL_KERNEL(matmul_q6_k_panels)(const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k,
                                             const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,
                                             int64_t panel_end) {
  const int64_t nb = k / kQuantBlock, num_blocks = k / 256, panel_bytes = num_blocks * kQ6KPanelBlockBytes;
  const auto* w = static_cast<const uint8_t*>(panels);
  if (m == 1) {
    int64_t p = decode_runs<kQ6KDecodePanels>(panel_begin, panel_end, [&](int64_t q, int64_t run) PAGODA_LAMBDA {
      q6_k_decode_panels<kQ6KDecodePanels>(x, x_half_sums, nb, w + q * panel_bytes, run * panel_bytes, num_blocks,
                                           y + q * kPanelRows, n - q * kPanelRows, run * kPanelRows);
    });
    for (; p < panel_end; ++p) {
      q6_k_decode_panels<1>(x, x_half_sums, nb, w + p * panel_bytes, panel_bytes, num_blocks, y + p * kPanelRows,
                            n - p * kPanelRows, kPanelRows);
    }
    return;
  }
  over_row_tiles(m, panel_begin, panel_end, [&](auto rows, int64_t i, int64_t p) PAGODA_LAMBDA {
    q6_k_tile<decltype(rows)::value>(x + i * nb, x_half_sums + 2 * i * nb, nb, w + p * panel_bytes, num_blocks,
                                     y + i * ldy + p * kPanelRows, ldy, n - p * kPanelRows);
  });
}

void PAGODA_MATMUL_KERNEL(matmul_q2_k_panels)(
    const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k, const void* panels, int64_t n, float* y,
    int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  k16_rows<false>(x, x_half_sums, m, k, panels, n, y, ldy, panel_begin, panel_end);
}

void PAGODA_MATMUL_KERNEL(matmul_q3_k_panels)(
    const BlockQ8Act* x, const int32_t* x_half_sums, int64_t m, int64_t k, const void* panels, int64_t n, float* y,
    int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  k16_rows<true>(x, x_half_sums, m, k, panels, n, y, ldy, panel_begin, panel_end);
}

}  // namespace pagoda::cpu
