// The AVX-512 paged-attention leaf of the AVX-512 kernel tables: attention_lanes.h on 16 lanes,
// so that a prefill's query vectors (two rows of a group of 8 heads) share each broadcast K and V
// element twice as widely as on AVX2. Each lane runs the AVX2 kernel's operations in the same
// order (exp below is math_avx2.h's polynomial, step for step), so its results are the AVX2
// lanes kernel's bits (attention_avx2_test.cpp checks it). The driver keeps the AVX2 kernels for
// groups of fewer than 4 query heads (one vector at a time) and for tiles of at most 8 query
// vectors (a decode step's, where 16 lanes would leave half of them empty). Built with -mavx2
// -mfma -mavx512f; read x86_kernels.h before adding an #include here.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/x86/attention_lanes.h"
#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {
namespace {

#define PAGODA_ATT512_INLINE inline __attribute__((always_inline))

struct Avx512Lanes {
  static constexpr int64_t kLanes = 16;
  using vec = __m512;
  static PAGODA_ATT512_INLINE vec zero() { return _mm512_setzero_ps(); }
  static PAGODA_ATT512_INLINE vec set1(float f) { return _mm512_set1_ps(f); }
  static PAGODA_ATT512_INLINE vec load(const float* p) { return _mm512_loadu_ps(p); }
  static PAGODA_ATT512_INLINE void store(float* p, vec v) { _mm512_storeu_ps(p, v); }
  static PAGODA_ATT512_INLINE vec broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static PAGODA_ATT512_INLINE vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static PAGODA_ATT512_INLINE vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static PAGODA_ATT512_INLINE vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static PAGODA_ATT512_INLINE vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
  static PAGODA_ATT512_INLINE vec max(vec a, vec b) { return _mm512_max_ps(a, b); }

  // avx2::exp (math_avx2.h) on 16 lanes, the same operations in the same order: clamp to [-87,
  // 88], n = round(x / ln 2) to nearest even, r = x - n ln2 in two steps, e^r by its Taylor
  // series to r^7 in Horner form, times 2^n built in the exponent bits.
  static PAGODA_ATT512_INLINE vec exp(vec x) {
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                          _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860682030941723e-6f), r);
    __m512 p = _mm512_set1_ps(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
  }

  static PAGODA_ATT512_INLINE vec outside_to_neg_inf(vec s, const int32_t* lo, const int32_t* hi, int32_t t) {
    const __m512i tv = _mm512_set1_epi32(t);
    const __mmask16 outside = _mm512_cmpgt_epi32_mask(tv, _mm512_loadu_si512(hi)) |
                              _mm512_cmpgt_epi32_mask(_mm512_loadu_si512(lo), tv);
    return _mm512_mask_blend_ps(outside, s, _mm512_set1_ps(-__builtin_inff()));
  }
  static PAGODA_ATT512_INLINE vec one_where_equal(vec a, vec b, vec v) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(a, b, _CMP_EQ_OQ), v, _mm512_set1_ps(1.0f));
  }
  static PAGODA_ATT512_INLINE vec zero_where_neg_inf(vec s, vec p) {
    return _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(s, _mm512_set1_ps(-__builtin_inff()), _CMP_NEQ_OQ), p);
  }
};

}  // namespace

void attention_tile_lanes_avx512(const AttentionTile& a) { attention_tile_lanes<Avx512Lanes>(a); }

}  // namespace pagoda::cpu
