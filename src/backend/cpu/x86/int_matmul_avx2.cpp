// The AVX2 leaf loops of Kernels::matmul_int (IntWeight: int8 or int4 codes with f32 scales per
// group, against activations quantized to int8 per token), over codes packed in panels of 8 rows
// (x86_kernels.h describes the layout, packed_weights.cpp makes it). Built with -mavx2 -mfma
// -mf16c -ffp-contract=off; read x86_kernels.h before adding an #include here.
//
// The 8 lanes of a vector are 8 output rows. Per 4 columns, the 8 rows' codes are one 32-byte
// vector and the input's 4 codes one broadcast int32: vpmaddubsw (int8: |w| unsigned against x
// with w's sign, pairs at most 2 x 128 x 127; int4: the stored code + 8, already unsigned, against
// x, pairs at most 2 x 15 x 127) then vpmaddwd into int32 lanes, summed over a group exactly; less
// zero * (the group's sum of x) where there are zero points (int4: the zero point + 8, or 8 where
// the weight has none); then acc + float(dot) * (scale * s_x), the reference's order and
// rounding: bit for bit.
//
// int_matmul_avxvnni.cpp builds this file a second time with -mavxvnni and PAGODA_AVXVNNI set,
// for the avxvnni table: there one vpdpbusd takes a 4-column step straight into the int32 lanes
// (u8 x s8 products summed in fours, exact and unsaturated), in place of vpmaddubsw + vpmaddwd
// (int8) or vpmaddubsw + an int16 add (int4; sum16 is then an int32 partial sum). The sums are
// the same integers, so the results are the same bits.
#include <immintrin.h>

#include "backend/cpu/x86/math_avx2.h"
#include "backend/cpu/x86/panel_avx2.h"
#include "backend/cpu/x86/x86_kernels.h"

#if defined(PAGODA_AVXVNNI)
#define PAGODA_INT_KERNEL(name) name##_avxvnni
#else
#define PAGODA_INT_KERNEL(name) name##_avx2
#endif

namespace pagoda::cpu {
namespace {

constexpr int64_t kPrefetchAhead = 768;  // bytes; as the GGUF int8 loops (matmul_avx2.cpp)
constexpr int64_t kScaleGroupsAhead = 4;

// dot[r] += the int32 lane sums of 4 columns: w holds the 8 rows' 4 int8 codes, x4[r] input r's.
template <int R>
PAGODA_INLINE void dot4(__m256i w, const int32_t (&x4)[R], __m256i (&dot)[R]) {
  const __m256i abs_w = _mm256_abs_epi8(w);
#if defined(PAGODA_AVXVNNI)
  unroll<R>([&](auto r) {
    dot[r.value] = _mm256_dpbusd_avx_epi32(dot[r.value], abs_w, _mm256_sign_epi8(_mm256_set1_epi32(x4[r.value]), w));
  });
#else
  const __m256i ones = _mm256_set1_epi16(1);
  unroll<R>([&](auto r) {
    const __m256i pairs = _mm256_maddubs_epi16(abs_w, _mm256_sign_epi8(_mm256_set1_epi32(x4[r.value]), w));
    dot[r.value] = _mm256_add_epi32(dot[r.value], _mm256_madd_epi16(pairs, ones));
  });
#endif
}

// As dot4, for unsigned codes u in [0, 15] (int4 + 8), no sign juggling, into int16 sums: pairs
// are at most 2 x 15 x 127, so a lane holds 8 of them (30480) before widen16 must run.
template <int R>
PAGODA_INLINE void dot4u16(__m256i u, const int32_t (&x4)[R], __m256i (&sum16)[R]) {
  unroll<R>([&](auto r) {
#if defined(PAGODA_AVXVNNI)
    sum16[r.value] = _mm256_dpbusd_avx_epi32(sum16[r.value], u, _mm256_set1_epi32(x4[r.value]));
#else
    sum16[r.value] = _mm256_add_epi16(sum16[r.value], _mm256_maddubs_epi16(u, _mm256_set1_epi32(x4[r.value])));
#endif
  });
}

// dot[r] += the int32 lane sums of sum16[r], which is cleared.
template <int R>
PAGODA_INLINE void widen16(__m256i (&sum16)[R], __m256i (&dot)[R]) {
#if defined(PAGODA_AVXVNNI)
  unroll<R>([&](auto r) {
    dot[r.value] = _mm256_add_epi32(dot[r.value], sum16[r.value]);
    sum16[r.value] = _mm256_setzero_si256();
  });
#else
  const __m256i ones = _mm256_set1_epi16(1);
  unroll<R>([&](auto r) {
    dot[r.value] = _mm256_add_epi32(dot[r.value], _mm256_madd_epi16(sum16[r.value], ones));
    sum16[r.value] = _mm256_setzero_si256();
  });
#endif
}

// int4 columns per widen16: 4 steps of 8, two pair sums per lane each.
constexpr int64_t kInt4Span = 32;

// dot[r] -= zero * (row r's sum of xq over group g), for a weight with zero points, or int4
// codes' implied zero of 8 (one broadcast, no load) where it has none.
template <int R, int kBits>
PAGODA_INLINE void subtract_zeros(const int32_t* zeros, const int32_t* xsum, int64_t groups, int64_t g,
                                  __m256i (&dot)[R]) {
  if (zeros == nullptr) {
    if constexpr (kBits == 4) {
      unroll<R>([&](auto r) {
        dot[r.value] = _mm256_sub_epi32(dot[r.value], _mm256_set1_epi32(8 * xsum[r.value * groups + g]));
      });
    }
    return;
  }
  const __m256i z = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(zeros + g * kPanelRows));
  unroll<R>([&](auto r) {
    dot[r.value] = _mm256_sub_epi32(dot[r.value], _mm256_mullo_epi32(z, _mm256_set1_epi32(xsum[r.value * groups + g])));
  });
}

// R input rows (xq rows kp apart, their scales s_x) against one panel: y[r, c] for c < valid.
template <int R, int kBits>
PAGODA_INLINE void int_tile(const int8_t* xq, const float* s_x, const int32_t* xsum, int64_t kp, int64_t group,
                            const uint8_t* panel, const float* scales, const int32_t* zeros, float* y, int64_t ldy,
                            int64_t valid, bool stream) {
  __m256 acc[R];
  unroll<R>([&](auto r) { acc[r.value] = _mm256_setzero_ps(); });
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const int64_t groups = kp / group;
  for (int64_t g = 0; g < groups; ++g) {
    __m256i dot[R];
    unroll<R>([&](auto r) { dot[r.value] = _mm256_setzero_si256(); });
    const int64_t t0 = g * group, t1 = t0 + group;
    if constexpr (kBits == 8) {
      for (int64_t t = t0; t < t1; t += 4) {
        const uint8_t* p = panel + t * kPanelRows;  // 32 bytes per 4 columns
        if (stream && (t & 7) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchAhead), _MM_HINT_T0);
        int32_t x4[R];
        unroll<R>([&](auto r) { x4[r.value] = load_i32(xq + r.value * kp + t); });
        dot4<R>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), x4, dot);
      }
    } else {
      __m256i sum16[R];
      unroll<R>([&](auto r) { sum16[r.value] = _mm256_setzero_si256(); });
      for (int64_t t = t0; t < t1; t += 8) {
        const uint8_t* p = panel + t * kPanelRows / 2;  // 32 bytes per 8 columns
        if (stream && (t & 15) == 0) _mm_prefetch(reinterpret_cast<const char*>(p + kPrefetchAhead), _MM_HINT_T0);
        const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
        const __m256i lo = _mm256_and_si256(bytes, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4);
        int32_t x_lo[R], x_hi[R];
        unroll<R>([&](auto r) {
          x_lo[r.value] = load_i32(xq + r.value * kp + t);
          x_hi[r.value] = load_i32(xq + r.value * kp + t + 4);
        });
        dot4u16<R>(lo, x_lo, sum16);
        dot4u16<R>(hi, x_hi, sum16);
        if ((t - t0) % kInt4Span == kInt4Span - 8 || t + 8 == t1) widen16<R>(sum16, dot);
      }
    }
    subtract_zeros<R, kBits>(zeros, xsum, groups, g, dot);
    const __m256 sw = _mm256_loadu_ps(scales + g * kPanelRows);
    unroll<R>([&](auto r) {
      const __m256 scale = _mm256_mul_ps(sw, _mm256_set1_ps(s_x[r.value]));
      acc[r.value] = _mm256_add_ps(acc[r.value], _mm256_mul_ps(_mm256_cvtepi32_ps(dot[r.value]), scale));
    });
  }
  unroll<R>([&](auto r) { store_out(y + r.value * ldy, acc[r.value], valid); });
}

// Decode (one input row): P panels at once (codes panel_bytes apart, scales and zero points
// panel_scales apart, outputs out_step apart), each through all of kp: P weight streams in flight
// and P independent chains, the same operations per panel as int_tile<1>.
template <int P, int kBits>
PAGODA_INLINE void int_decode_panels(const int8_t* xq, float s_x, const int32_t* xsum, int64_t kp, int64_t group,
                                     const uint8_t* panels, int64_t panel_bytes, const float* scales,
                                     const int32_t* zeros, int64_t panel_scales, float* y, int64_t valid,
                                     int64_t out_step) {
  __m256 acc[P];
  unroll<P>([&](auto p) { acc[p.value] = _mm256_setzero_ps(); });
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256 v_sx = _mm256_set1_ps(s_x);
  for (int64_t g = 0; g < kp / group; ++g) {
    // The scales and zero points are streams of their own, 32 bytes per group and panel: ask for
    // them kScaleGroupsAhead groups ahead (a miss at the group's end stalls every panel's chain).
    unroll<P>([&](auto p) {
      const int64_t ahead = p.value * panel_scales + (g + kScaleGroupsAhead) * kPanelRows;
      _mm_prefetch(reinterpret_cast<const char*>(scales + ahead), _MM_HINT_T0);
      if (zeros != nullptr) _mm_prefetch(reinterpret_cast<const char*>(zeros + ahead), _MM_HINT_T0);
    });
    __m256i dot[P][1];
    unroll<P>([&](auto p) { dot[p.value][0] = _mm256_setzero_si256(); });
    const int64_t t0 = g * group, t1 = t0 + group;
    if constexpr (kBits == 8) {
      for (int64_t t = t0; t < t1; t += 4) {
        const int32_t x4[1] = {load_i32(xq + t)};
        unroll<P>([&](auto p) {
          const uint8_t* w = panels + p.value * panel_bytes + t * kPanelRows;
          if ((t & 7) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchAhead), _MM_HINT_T0);
          dot4<1>(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)), x4, dot[p.value]);
        });
      }
    } else {
      __m256i sum16[P][1];
      unroll<P>([&](auto p) { sum16[p.value][0] = _mm256_setzero_si256(); });
      for (int64_t t = t0; t < t1; t += 8) {
        const int32_t x_lo[1] = {load_i32(xq + t)}, x_hi[1] = {load_i32(xq + t + 4)};
        const bool widen = (t - t0) % kInt4Span == kInt4Span - 8 || t + 8 == t1;
        unroll<P>([&](auto p) {
          const uint8_t* w = panels + p.value * panel_bytes + t * kPanelRows / 2;
          if ((t & 15) == 0) _mm_prefetch(reinterpret_cast<const char*>(w + kPrefetchAhead), _MM_HINT_T0);
          const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w));
          dot4u16<1>(_mm256_and_si256(bytes, low4), x_lo, sum16[p.value]);
          dot4u16<1>(_mm256_and_si256(_mm256_srli_epi16(bytes, 4), low4), x_hi, sum16[p.value]);
          if (widen) widen16<1>(sum16[p.value], dot[p.value]);
        });
      }
    }
    unroll<P>([&](auto p) {
      subtract_zeros<1, kBits>(zeros == nullptr ? nullptr : zeros + p.value * panel_scales, xsum, 0, g, dot[p.value]);
      const __m256 scale = _mm256_mul_ps(_mm256_loadu_ps(scales + p.value * panel_scales + g * kPanelRows), v_sx);
      acc[p.value] = _mm256_add_ps(acc[p.value], _mm256_mul_ps(_mm256_cvtepi32_ps(dot[p.value][0]), scale));
    });
  }
  unroll<P>([&](auto p) { store_out(y + p.value * out_step, acc[p.value], valid - p.value * out_step); });
}

constexpr int kIntRows = 4;  // input rows per tile
constexpr int kIntDecodePanels = 4;

template <int kBits>
PAGODA_FLATTEN void int_rows(const int8_t* xq, const float* s_x, const int32_t* xsum, int64_t m, int64_t kp,
                             int64_t group, const uint8_t* codes, const float* scales, const int32_t* zeros,
                             int64_t n, float* y, int64_t ldy, int64_t p0, int64_t p1) {
  const int64_t panel_bytes = kPanelRows * kp * kBits / 8;
  const int64_t groups = kp / group, panel_scales = kPanelRows * groups;
  auto zeros_of = [&](int64_t p) { return zeros == nullptr ? nullptr : zeros + p * panel_scales; };
  if (m == 1) {
    int64_t p = decode_runs<kIntDecodePanels>(p0, p1, [&](int64_t q, int64_t run) {
      int_decode_panels<kIntDecodePanels, kBits>(xq, s_x[0], xsum, kp, group, codes + q * panel_bytes,
                                                 run * panel_bytes, scales + q * panel_scales, zeros_of(q),
                                                 run * panel_scales, y + q * kPanelRows, n - q * kPanelRows,
                                                 run * kPanelRows);
    });
    for (; p < p1; ++p) {
      int_decode_panels<1, kBits>(xq, s_x[0], xsum, kp, group, codes + p * panel_bytes, panel_bytes,
                                  scales + p * panel_scales, zeros_of(p), panel_scales, y + p * kPanelRows,
                                  n - p * kPanelRows, kPanelRows);
    }
    return;
  }
  for (int64_t p = p0; p < p1; ++p) {
    const uint8_t* panel = codes + p * panel_bytes;
    const float* sc = scales + p * panel_scales;
    const int32_t* zp = zeros_of(p);
    const int64_t valid = n - p * kPanelRows;
    for (int64_t i = 0; i < m; i += kIntRows) {
      const int8_t* xi = xq + i * kp;
      const int32_t* si = xsum == nullptr ? nullptr : xsum + i * groups;
      float* yi = y + i * ldy + p * kPanelRows;
      with_rows<kIntRows>(m - i, [&](auto rows) PAGODA_LAMBDA {
        int_tile<decltype(rows)::value, kBits>(xi, s_x + i, si, kp, group, panel, sc, zp, yi, ldy, valid, m == 1);
      });
    }
  }
}

}  // namespace

void PAGODA_INT_KERNEL(matmul_int_packed)(const int8_t* xq, const float* s_x, const int32_t* xsum, int64_t m, int64_t kp,
                            int64_t group, int bits, const void* codes, const float* scales, const int32_t* zeros,
                            int64_t n, float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  const auto* c = static_cast<const uint8_t*>(codes);
  if (bits == 8) {
    int_rows<8>(xq, s_x, xsum, m, kp, group, c, scales, zeros, n, y, ldy, panel_begin, panel_end);
  } else {
    int_rows<4>(xq, s_x, xsum, m, kp, group, c, scales, zeros, n, y, ldy, panel_begin, panel_end);
  }
}

#if !defined(PAGODA_AVXVNNI)  // one copy, in the AVX2 build: both tables quantize with it
PAGODA_FLATTEN float quantize_activation_row_int8_avx2(const float* x, int64_t k, int64_t kp,
                                                                 float static_scale, int8_t* q) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  float scale = static_scale, inv = 0;
  if (static_scale > 0) {
    inv = 1.0f / static_scale;
  } else {
    __m256 amax8 = _mm256_setzero_ps();
    int64_t t = 0;
    for (; t + 8 <= k; t += 8) amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(x + t)));
    float amax = avx2::hmax(amax8);
    for (; t < k; ++t) {
      const float a = x[t] < 0 ? -x[t] : x[t];
      amax = a > amax ? a : amax;
    }
    scale = amax / 127.0f;
    inv = amax != 0 ? 127.0f / amax : 0.0f;
  }
  const __m256 v_inv = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t t = 0;
  for (; t + 32 <= k; t += 32) {
    __m256i v[4];
    unroll<4>([&](auto s) {
      const __m256 f = _mm256_min_ps(hi, _mm256_max_ps(lo, _mm256_mul_ps(_mm256_loadu_ps(x + t + 8 * s.value), v_inv)));
      v[s.value] = _mm256_cvtps_epi32(f);  // to nearest even, as the reference's nearbyint
    });
    const __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(v[0], v[1]), _mm256_packs_epi32(v[2], v[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + t), _mm256_permutevar8x32_epi32(q16, order));
  }
  for (; t < k; ++t) {
    float f = x[t] * inv;
    f = f > 127.0f ? 127.0f : (f < -127.0f ? -127.0f : f);
    q[t] = static_cast<int8_t>(_mm_cvtss_si32(_mm_set_ss(f)));  // current mode: to nearest even
  }
  for (; t < kp; ++t) q[t] = 0;
  return scale;
}

#endif  // !PAGODA_AVXVNNI

}  // namespace pagoda::cpu
