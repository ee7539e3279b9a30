// The AVX-512 VNNI leaf of Kernels::matmul_int (the avx512vnni table), over the codes
// pack_int_weight_avx2 lays out in panels of 8 rows (x86_kernels.h): two panels at a time, panel
// p in the low half of a 512-bit vector and panel p + 1 in the high half, so the 16 int32 lanes
// are 16 output rows and one vpdpbusd takes a 4-column step of all of them. Built with -mavx2
// -mfma -mf16c -mavx512f -mavx512bw -mavx512vnni -ffp-contract=off; read x86_kernels.h before
// adding an #include here.
//
// int8 codes: vpdpbusd multiplies unsigned bytes by signed ones. The avx2 and avxvnni leaves make
// the weight unsigned (|w|, its sign moved onto x: two more operations per step and input row).
// Here the input is unsigned instead, made so once per row by the driver (u = x + 128, x XOR
// 0x80), so a step costs one vpdpbusd per input row, and per group sum(u w) - 128 sum(w) =
// sum(x w), with 128 sum(w) one more vpdpbusd per step (0x80 bytes against w) that every input row
// of the tile shares. The int32 lanes may wrap (vpdpbusd does not saturate); the difference is
// the exact dot all the same, which fits. int4 codes (stored + 8, unsigned) go against the signed
// input, as in the avxvnni leaf. Then, as there, less the zero points' terms, and acc +
// float(dot) * (scale * s_x): the reference's integers, order and rounding, bit for bit.
#include <immintrin.h>

#include "backend/cpu/x86/panel_avx512.h"
#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {
namespace {

constexpr int64_t kPrefetchAhead = 768;  // bytes ahead in each panel's code stream (decode)
constexpr int64_t kScaleGroupsAhead = 4;  // groups ahead in the scale and zero streams (decode)
constexpr int kRows = 8;                  // input rows per tile (prefill)
constexpr int kDecodePairs = 2;           // panel pairs streamed side by side when m = 1

// Two panels of the tile, a (lanes 0-7) and b (lanes 8-15): p and p + 1 in prefill; for an odd
// last panel, b is a again and only its 8 lanes are stored. mask: the lanes stored.
struct PanelPair {
  const uint8_t* a;
  const uint8_t* b;
  const float* scales_a;
  const float* scales_b;
  const int32_t* zeros_a;  // nullptr: no zero points
  const int32_t* zeros_b;
  int64_t y_col;    // the output column of lane 0
  int64_t y_col_b;  // of lane 8: y_col + 8 for consecutive panels (prefill), further in decode
  __mmask16 mask;
};

PAGODA_INLINE void prefetch(const void* p) { _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0); }

// R input rows (xq rows kp apart: unsigned x + 128 for int8 codes, signed x for int4) against Q
// panel pairs; y[r, y_col + lane] for the valid lanes of each pair. stream: decode (prefetch).
template <int R, int Q, int kBits>
PAGODA_INLINE void int_tile(const uint8_t* xq, const float* s_x, const int32_t* xsum, int64_t kp, int64_t group,
                            const PanelPair (&pairs)[Q], float* y, int64_t ldy, bool stream) {
  __m512 acc[Q][R];
  unroll<Q>([&](auto q) PAGODA_LAMBDA {
    unroll<R>([&](auto r) PAGODA_LAMBDA { acc[q.value][r.value] = _mm512_setzero_ps(); });
  });
  const __m512i low4 = _mm512_set1_epi8(0x0f), bias = _mm512_set1_epi8(static_cast<char>(0x80));
  const int64_t groups = kp / group;
  for (int64_t g = 0; g < groups; ++g) {
    if (stream) {
      unroll<Q>([&](auto q) PAGODA_LAMBDA {
        const PanelPair& pp = pairs[q.value];
        prefetch(pp.scales_a + (g + kScaleGroupsAhead) * kPanelRows);
        prefetch(pp.scales_b + (g + kScaleGroupsAhead) * kPanelRows);
        if (pp.zeros_a != nullptr) {
          prefetch(pp.zeros_a + (g + kScaleGroupsAhead) * kPanelRows);
          prefetch(pp.zeros_b + (g + kScaleGroupsAhead) * kPanelRows);
        }
      });
    }
    __m512i dot[Q][R];
    unroll<Q>([&](auto q) PAGODA_LAMBDA {
      unroll<R>([&](auto r) PAGODA_LAMBDA { dot[q.value][r.value] = _mm512_setzero_si512(); });
    });
    const int64_t t0 = g * group, t1 = t0 + group;
    if constexpr (kBits == 8) {
      __m512i wsum[Q];  // 128 * sum(w) per lane
      unroll<Q>([&](auto q) PAGODA_LAMBDA { wsum[q.value] = _mm512_setzero_si512(); });
      for (int64_t t = t0; t < t1; t += 4) {
        __m512i x4[R];
        unroll<R>([&](auto r) PAGODA_LAMBDA { x4[r.value] = _mm512_set1_epi32(load_i32(xq + r.value * kp + t)); });
        unroll<Q>([&](auto q) PAGODA_LAMBDA {
          const PanelPair& pp = pairs[q.value];
          const int64_t at = t * kPanelRows;  // 32 bytes per 4 columns
          if (stream && (t & 7) == 0) {
            prefetch(pp.a + at + kPrefetchAhead);
            prefetch(pp.b + at + kPrefetchAhead);
          }
          const __m512i w = load_pair(pp.a + at, pp.b + at);
          wsum[q.value] = _mm512_dpbusd_epi32(wsum[q.value], bias, w);
          unroll<R>([&](auto r) PAGODA_LAMBDA {
            dot[q.value][r.value] = _mm512_dpbusd_epi32(dot[q.value][r.value], x4[r.value], w);
          });
        });
      }
      unroll<Q>([&](auto q) PAGODA_LAMBDA {
        unroll<R>([&](auto r) PAGODA_LAMBDA {
          dot[q.value][r.value] = _mm512_sub_epi32(dot[q.value][r.value], wsum[q.value]);
        });
      });
    } else {
      for (int64_t t = t0; t < t1; t += 8) {
        __m512i x_lo[R], x_hi[R];
        unroll<R>([&](auto r) PAGODA_LAMBDA {
          x_lo[r.value] = _mm512_set1_epi32(load_i32(xq + r.value * kp + t));
          x_hi[r.value] = _mm512_set1_epi32(load_i32(xq + r.value * kp + t + 4));
        });
        unroll<Q>([&](auto q) PAGODA_LAMBDA {
          const PanelPair& pp = pairs[q.value];
          const int64_t at = t * kPanelRows / 2;  // 32 bytes per 8 columns
          if (stream && (t & 15) == 0) {
            prefetch(pp.a + at + kPrefetchAhead);
            prefetch(pp.b + at + kPrefetchAhead);
          }
          const __m512i bytes = load_pair(pp.a + at, pp.b + at);
          const __m512i lo = _mm512_and_si512(bytes, low4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(bytes, 4), low4);
          unroll<R>([&](auto r) PAGODA_LAMBDA {
            __m512i& d = dot[q.value][r.value];
            d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(d, lo, x_lo[r.value]), hi, x_hi[r.value]);
          });
        });
      }
    }
    unroll<Q>([&](auto q) PAGODA_LAMBDA {
      const PanelPair& pp = pairs[q.value];
      if (pp.zeros_a != nullptr) {  // less zero * (the group's input sum)
        const __m512i z = load_pair(pp.zeros_a + g * kPanelRows, pp.zeros_b + g * kPanelRows);
        unroll<R>([&](auto r) PAGODA_LAMBDA {
          dot[q.value][r.value] = _mm512_sub_epi32(dot[q.value][r.value],
                                                   _mm512_mullo_epi32(z, _mm512_set1_epi32(xsum[r.value * groups + g])));
        });
      } else if constexpr (kBits == 4) {  // the implied zero of 8
        unroll<R>([&](auto r) PAGODA_LAMBDA {
          dot[q.value][r.value] = _mm512_sub_epi32(dot[q.value][r.value], _mm512_set1_epi32(8 * xsum[r.value * groups + g]));
        });
      }
      const __m512 sw = load_pair_ps(pp.scales_a + g * kPanelRows, pp.scales_b + g * kPanelRows);
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        const __m512 scale = _mm512_mul_ps(sw, _mm512_set1_ps(s_x[r.value]));
        acc[q.value][r.value] = _mm512_add_ps(acc[q.value][r.value],
                                              _mm512_mul_ps(_mm512_cvtepi32_ps(dot[q.value][r.value]), scale));
      });
    });
  }
  unroll<Q>([&](auto q) PAGODA_LAMBDA {
    const PanelPair& pp = pairs[q.value];
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      store_halves(y + r.value * ldy, pp.y_col, pp.y_col_b, pp.mask, acc[q.value][r.value]);
    });
  });
}

template <int kBits>
PAGODA_FLATTEN void int_rows(const uint8_t* xq, const float* s_x, const int32_t* xsum, int64_t m, int64_t kp,
                             int64_t group, const uint8_t* codes, const float* scales, const int32_t* zeros,
                             int64_t n, float* y, int64_t ldy, int64_t p0, int64_t p1) {
  const int64_t panel_bytes = kPanelRows * kp * kBits / 8;
  const int64_t groups = kp / group, panel_scales = kPanelRows * groups;
  // Panels a (lanes 0-7) and b (lanes 8-15; a again for an odd last panel).
  auto pair_of = [&](int64_t a, int64_t b) {
    const __mmask16 mask = halves_mask(a * kPanelRows, b * kPanelRows, n) & (b == a ? 0x00ff : 0xffff);
    return PanelPair{codes + a * panel_bytes,
                     codes + b * panel_bytes,
                     scales + a * panel_scales,
                     scales + b * panel_scales,
                     zeros == nullptr ? nullptr : zeros + a * panel_scales,
                     zeros == nullptr ? nullptr : zeros + b * panel_scales,
                     a * kPanelRows,
                     b * kPanelRows,
                     mask};
  };
  auto pair_at = [&](int64_t p) { return pair_of(p, pair_partner(p, p1)); };
  int64_t p = p0;
  if (m == 1) {
    // Decode: 2 kDecodePairs weight streams in flight, each through a run of consecutive panels
    // (decode_runs, panel_avx2.h); the panels left over go by pairs below.
    p = decode_runs<2 * kDecodePairs>(p0, p1, [&](int64_t i, int64_t run) PAGODA_LAMBDA {
      PanelPair pairs[kDecodePairs];
      for (int q = 0; q < kDecodePairs; ++q) pairs[q] = pair_of(i + 2 * q * run, i + (2 * q + 1) * run);
      int_tile<1, kDecodePairs, kBits>(xq, s_x, xsum, kp, group, pairs, y, ldy, true);
    });
  }
  for (; p < p1; p += 2) {
    const PanelPair pairs[1] = {pair_at(p)};
    for (int64_t i = 0; i < m; i += kRows) {
      const uint8_t* xi = xq + i * kp;
      const int32_t* si = xsum == nullptr ? nullptr : xsum + i * groups;
      float* yi = y + i * ldy;
      const bool stream = m == 1;
      // A switch, not with_rows (panel_avx2.h): through its lambda GCC 12 kept the int4 tiles'
      // 32 vectors of state worse, at half the speed (m = 64, 2 threads: 214 against 450 GMAC/s).
      switch (m - i < kRows ? m - i : kRows) {
        case 1: int_tile<1, 1, kBits>(xi, s_x + i, si, kp, group, pairs, yi, ldy, stream); break;
        case 2: int_tile<2, 1, kBits>(xi, s_x + i, si, kp, group, pairs, yi, ldy, stream); break;
        case 3: int_tile<3, 1, kBits>(xi, s_x + i, si, kp, group, pairs, yi, ldy, stream); break;
        case 4: int_tile<4, 1, kBits>(xi, s_x + i, si, kp, group, pairs, yi, ldy, stream); break;
        case 5: int_tile<5, 1, kBits>(xi, s_x + i, si, kp, group, pairs, yi, ldy, stream); break;
        case 6: int_tile<6, 1, kBits>(xi, s_x + i, si, kp, group, pairs, yi, ldy, stream); break;
        case 7: int_tile<7, 1, kBits>(xi, s_x + i, si, kp, group, pairs, yi, ldy, stream); break;
        default: int_tile<8, 1, kBits>(xi, s_x + i, si, kp, group, pairs, yi, ldy, stream); break;
      }
    }
  }
}

}  // namespace

void matmul_int_packed_avx512vnni(const int8_t* xq, const float* s_x, const int32_t* xsum, int64_t m, int64_t kp,
                                  int64_t group, int bits, const void* codes, const float* scales,
                                  const int32_t* zeros, int64_t n, float* y, int64_t ldy, int64_t panel_begin,
                                  int64_t panel_end) {
  const auto* c = static_cast<const uint8_t*>(codes);
  const auto* x = reinterpret_cast<const uint8_t*>(xq);
  if (bits == 8) {
    int_rows<8>(x, s_x, xsum, m, kp, group, c, scales, zeros, n, y, ldy, panel_begin, panel_end);
  } else {
    int_rows<4>(x, s_x, xsum, m, kp, group, c, scales, zeros, n, y, ldy, panel_begin, panel_end);
  }
}

}  // namespace pagoda::cpu
