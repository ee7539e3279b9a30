// The AVX-512 VNNI leaf of the avx512vnni table's matmul for the 32-element block types (q8_0,
// q4_0, q4_1, q5_0, q5_1) in batched products (m > 1; decode and the K-quants take the 256-bit
// avx512vl leaves), over pack_matmul_weight_avx2's panels of 8 rows (x86_kernels.h; matmul_avx2.cpp
// describes each type's block). Two panels per 512-bit vector, p in the low half and p + 1 in the
// high half, so a vpdpbusd is a 4-column step of 16 output rows.
// Built with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vnni -ffp-contract=off; read
// x86_kernels.h before adding an #include here.
//
// q8_0: as in int_matmul_avx512vnni.cpp, the input codes come unsigned (x + 128, made so by the
// driver), a step is one vpdpbusd per input row, and each block's 128 * sum(w), one more
// vpdpbusd per step that the tile's input rows share, comes off its dot. The nibble types' codes
// are unsigned already and go against the signed input codes, as in the avxvnni leaf. Then the
// block's exact integer dot goes into acc + float(dot) * (d_w * d_x) (and the mins' term), the
// reference's order and rounding, bit for bit (matmul_avx2.cpp's quant_tile, on 16 rows).
#include <immintrin.h>

#include "backend/cpu/x86/panel_avx512.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/check.h"
#include "tensor/quant_blocks.h"

namespace pagoda::cpu {
namespace {

constexpr int kRows = 8;      // input rows per tile
constexpr int kFewRows = 8;   // up to this many rows, the panels go in long runs (pair_rows)
constexpr int kFewPairs = 2;  // panel pairs side by side then
// Each panel pair runs through all of k for every row tile before the next pair: a pair's blocks
// (18 KiB of q4_0, 35 KiB of q8_0 at k = 2048) come from L1 or L2 for all the tiles after the
// first, and each output is written once. (Slices of 16 blocks, each read by every row tile,
// reloaded and stored the outputs once per slice: lines of y that had left the cache, at rows
// ldy apart, the loads the tiles waited on. Whole k: prefill 512 q4_0 1.25 to 1.40x, q8_0 1.12
// to 1.24x, Zen 5, 2026-12-05.)

// q8_0 panels (matmul_avx2.cpp's Q8Panel): 8 groups g of 32 bytes after the scales, each the 4
// int8 weights [4g, 4g + 4) of rows 0..7. Input codes unsigned: the block's dot is sum(u w) less
// 128 sum(w), the latter one vpdpbusd per group for all the tile's rows.
struct Q8Pair {
  static constexpr int64_t kBlockBytes = 16 + 8 * kQuantBlock;
  static constexpr bool kHasMin = false;
  template <int R>
  static PAGODA_INLINE void dots(const uint8_t* wa, const uint8_t* wb, const BlockQ8Act* const* xb, const int32_t*,
                                 __m512i (&dot)[R]) {
    const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
    __m512i wsum = _mm512_setzero_si512();  // 128 * sum(w) per lane
    unroll<R>([&](auto r) PAGODA_LAMBDA { dot[r.value] = _mm512_setzero_si512(); });
    unroll<8>([&](auto g) PAGODA_LAMBDA {
      const __m512i w = load_pair(wa + 16 + 32 * g.value, wb + 16 + 32 * g.value);
      wsum = _mm512_dpbusd_epi32(wsum, bias, w);
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        dot[r.value] = _mm512_dpbusd_epi32(dot[r.value], _mm512_set1_epi32(load_i32(xb[r.value]->qs + 4 * g.value)), w);
      });
    });
    unroll<R>([&](auto r) PAGODA_LAMBDA { dot[r.value] = _mm512_sub_epi32(dot[r.value], wsum); });
  }
};

// Shifts each byte's bit kFrom to bit kTo (other bits: masked off by the caller).
template <int kFrom, int kTo>
PAGODA_INLINE __m512i move_bit(__m512i v) {
  if constexpr (kFrom < kTo) return _mm512_slli_epi16(v, kTo - kFrom);
  else if constexpr (kFrom > kTo) return _mm512_srli_epi16(v, kFrom - kTo);
  else return v;
}

// q4_0 / q4_1 / q5_0 / q5_1 panels (matmul_avx2.cpp's NibblePanel, whose comment has the layout):
// the unsigned codes against the signed input codes, less kOffset * (the block's input sum).
template <bool kMin, bool kFifth, int kOffset>
struct NibblePair : NibblePanelLayout<kMin, kFifth> {
  using NibblePanelLayout<kMin, kFifth>::kFifthAt;
  using NibblePanelLayout<kMin, kFifth>::kCodesAt;
  static constexpr bool kHasMin = kMin;
  template <int R>
  static PAGODA_INLINE void dots(const uint8_t* wa, const uint8_t* wb, const BlockQ8Act* const* xb,
                                 const int32_t* x_sums, __m512i (&dot)[R]) {
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    __m512i fifth = _mm512_setzero_si512();
    if constexpr (kFifth) fifth = load_pair(wa + kFifthAt, wb + kFifthAt);
    unroll<R>([&](auto r) PAGODA_LAMBDA { dot[r.value] = _mm512_setzero_si512(); });
    unroll<4>([&](auto h) PAGODA_LAMBDA {
      const __m512i bytes = load_pair(wa + kCodesAt + 32 * h.value, wb + kCodesAt + 32 * h.value);
      __m512i lo = _mm512_and_si512(bytes, low4);
      __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low4);
      if constexpr (kFifth) {
        const __m512i bit4 = _mm512_set1_epi8(0x10);
        lo = _mm512_or_si512(lo, _mm512_and_si512(move_bit<2 * h.value, 4>(fifth), bit4));
        hi = _mm512_or_si512(hi, _mm512_and_si512(move_bit<2 * h.value + 1, 4>(fifth), bit4));
      }
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        const __m512i x_lo = _mm512_set1_epi32(load_i32(xb[r.value]->qs + 4 * h.value));
        const __m512i x_hi = _mm512_set1_epi32(load_i32(xb[r.value]->qs + 16 + 4 * h.value));
        dot[r.value] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[r.value], lo, x_lo), hi, x_hi);
      });
    });
    if constexpr (kOffset != 0) {
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        dot[r.value] = _mm512_sub_epi32(dot[r.value], _mm512_set1_epi32(kOffset * x_sums[r.value]));
      });
    }
  }
};

// Two panels of a tile, a (lanes 0-7) and b (lanes 8-15): p and p + 1 (or p again for an odd
// last panel, its 8 lanes stored once), or, for a few rows, panels of two runs (decode_runs).
struct PanelPair {
  const uint8_t* a;
  const uint8_t* b;
  int64_t col_a, col_b;  // their first output columns
  __mmask16 mask;        // the lanes stored
};

// y[r, lanes of each pair] = the nb blocks of R input rows (row r's blocks at x + r * nb, their
// sums at x_sums + r * nb) against Q panel pairs: from 0, per block acc + float(dot) * (d_w * d_x),
// then for q4_1 / q5_1 acc + float(X) * (m * d_x), matmul_avx2.cpp's block_step.
template <class W, int R, int Q>
PAGODA_INLINE void pair_tile(const BlockQ8Act* x, const int32_t* x_sums, int64_t nb, const PanelPair (&pairs)[Q],
                             float* y, int64_t ldy) {
  __m512 acc[Q][R];
  unroll<Q>([&](auto q) PAGODA_LAMBDA {
    unroll<R>([&](auto r) PAGODA_LAMBDA { acc[q.value][r.value] = _mm512_setzero_ps(); });
  });
  for (int64_t blk = 0; blk < nb; ++blk) {
    const BlockQ8Act* xb[R];
    int32_t sums[R];
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      xb[r.value] = x + r.value * nb + blk;
      sums[r.value] = x_sums == nullptr ? 0 : x_sums[r.value * nb + blk];
    });
    unroll<Q>([&](auto q) PAGODA_LAMBDA {
      const uint8_t* wa = pairs[q.value].a + blk * W::kBlockBytes;
      const uint8_t* wb = pairs[q.value].b + blk * W::kBlockBytes;
      __m512i dot[R];
      W::template dots<R>(wa, wb, xb, sums, dot);
      const __m512 d_w = load_pair_ph(wa, wb);
      __m512 m_w = _mm512_setzero_ps();
      if constexpr (W::kHasMin) m_w = load_pair_ph(wa + W::kMinAt, wb + W::kMinAt);
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        __m512& a = acc[q.value][r.value];
        const __m512 dx = _mm512_set1_ps(xb[r.value]->d);
        a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_cvtepi32_ps(dot[r.value]), _mm512_mul_ps(d_w, dx)));
        if constexpr (W::kHasMin) {
          a = _mm512_add_ps(a, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_set1_epi32(sums[r.value])), _mm512_mul_ps(m_w, dx)));
        }
      });
    });
  }
  unroll<Q>([&](auto q) PAGODA_LAMBDA {
    const PanelPair& pp = pairs[q.value];
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      store_halves(y + r.value * ldy, pp.col_a, pp.col_b, pp.mask, acc[q.value][r.value]);
    });
  });
}

template <class W>
PAGODA_FLATTEN void pair_rows(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t nb, const uint8_t* w,
                              int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  const int64_t panel_bytes = nb * W::kBlockBytes;
  auto pair_of = [&](int64_t a, int64_t b) {
    const __mmask16 mask = halves_mask(a * kPanelRows, b * kPanelRows, n) & (b == a ? 0x00ff : 0xffff);
    return PanelPair{w + a * panel_bytes, w + b * panel_bytes, a * kPanelRows, b * kPanelRows, mask};
  };
  int64_t p = panel_begin;
  if (m <= kFewRows) {
    // A few rows (speculative verification, a draft's catch-up), read once from memory: as decode
    // does, the panels go in kFewPairs * 2 runs of consecutive panels, one weight stream each,
    // instead of pairs of neighbours (each panel a new stream that the prefetchers start cold: 2
    // rows of q4_0 had run at 0.45 of the memory's read, from the cache 0.9, Zen 5).
    const auto runs = [&]<int R, int Q>() {
      p = decode_runs<2 * Q>(panel_begin, panel_end, [&](int64_t i, int64_t run) PAGODA_LAMBDA {
        PanelPair pairs[Q];
        for (int q = 0; q < Q; ++q) pairs[q] = pair_of(i + 2 * q * run, i + (2 * q + 1) * run);
        pair_tile<W, R, Q>(x, x_sums, nb, pairs, y, ldy);
      });
    };
    switch (m) {
      case 1: runs.template operator()<1, 2>(); break;
      case 2: runs.template operator()<2, 2>(); break;
      case 3: runs.template operator()<3, 2>(); break;
      case 4: runs.template operator()<4, 2>(); break;
      case 5: runs.template operator()<5, 1>(); break;
      case 6: runs.template operator()<6, 1>(); break;
      case 7: runs.template operator()<7, 1>(); break;
      default: runs.template operator()<8, 1>(); break;
    }
  }
  for (; p < panel_end; p += 2) {
    const PanelPair pairs[1] = {pair_of(p, pair_partner(p, panel_end))};
    for (int64_t i = 0; i < m; i += kRows) {
      const BlockQ8Act* xi = x + i * nb;
      const int32_t* si = x_sums == nullptr ? nullptr : x_sums + i * nb;
      float* yi = y + i * ldy;
      // A switch, as in int_matmul_avx512vnni.cpp (with_rows measured slower there).
      switch (m - i < kRows ? m - i : kRows) {
        case 1: pair_tile<W, 1, 1>(xi, si, nb, pairs, yi, ldy); break;
        case 2: pair_tile<W, 2, 1>(xi, si, nb, pairs, yi, ldy); break;
        case 3: pair_tile<W, 3, 1>(xi, si, nb, pairs, yi, ldy); break;
        case 4: pair_tile<W, 4, 1>(xi, si, nb, pairs, yi, ldy); break;
        case 5: pair_tile<W, 5, 1>(xi, si, nb, pairs, yi, ldy); break;
        case 6: pair_tile<W, 6, 1>(xi, si, nb, pairs, yi, ldy); break;
        case 7: pair_tile<W, 7, 1>(xi, si, nb, pairs, yi, ldy); break;
        default: pair_tile<W, 8, 1>(xi, si, nb, pairs, yi, ldy); break;
      }
    }
  }
}

}  // namespace

void matmul_q8act_batched_avx512vnni(const BlockQ8Act* x, const int32_t* x_sums, int64_t m, int64_t k, DType type,
                                     const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,
                                     int64_t panel_end) {
  const int64_t nb = k / kQuantBlock;
  const auto* w = static_cast<const uint8_t*>(panels);
  switch (type) {
    case DType::kQ8_0: return pair_rows<Q8Pair>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    case DType::kQ4_0:
      return pair_rows<NibblePair<false, false, 8>>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    case DType::kQ4_1:
      return pair_rows<NibblePair<true, false, 0>>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    case DType::kQ5_0:
      return pair_rows<NibblePair<false, true, 16>>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    case DType::kQ5_1:
      return pair_rows<NibblePair<true, true, 0>>(x, x_sums, m, nb, w, n, y, ldy, panel_begin, panel_end);
    default: break;
  }
  PAGODA_CHECK(false && "matmul_q8act_batched_avx512vnni takes q8_0, q4_0, q4_1, q5_0 or q5_1 panels");
}

}  // namespace pagoda::cpu
