// Helpers of the AVX-512 leaf files (int_matmul_avx512vnni.cpp, matmul_avx512vnni.cpp,
// matmul_float_avx512.cpp, matmul_bf16_avx512.cpp), which take pack_*_avx2's panels of kPanelRows
// rows two at a time: panel p in the low half of a 512-bit vector, its partner in the high half.
// Include only from files built with -mavx512f -mavx512bw; internal linkage, as panel_avx2.h (see
// x86_kernels.h for why).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/x86/panel_avx2.h"

namespace pagoda::cpu {
namespace {

// 32 bytes at a (panel p's) and at b (its partner's) as one vector.
PAGODA_INLINE __m512i load_pair(const void* a, const void* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(static_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(static_cast<const __m256i*>(b)), 1);
}

// 8 floats at a and 8 at b.
PAGODA_INLINE __m512 load_pair_ps(const float* a, const float* b) { return _mm512_castsi512_ps(load_pair(a, b)); }

// 8 fp16 values at a and 8 at b (16 bytes each), as 16 floats.
PAGODA_INLINE __m512 load_pair_ph(const uint8_t* a, const uint8_t* b) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  return _mm512_cvtph_ps(h);
}

// Panel p's partner among the panels [.., p1): p + 1, or p itself where p is the last (an odd
// count), whose repeated half is then computed and not stored.
PAGODA_INLINE int64_t pair_partner(int64_t p, int64_t p1) { return p + 1 < p1 ? p + 1 : p; }

// Lanes [0, lanes) of a 16-lane vector (none for lanes <= 0, all from 16 on).
PAGODA_INLINE __mmask16 first_lanes(int64_t lanes) {
  return lanes >= 16 ? static_cast<__mmask16>(0xffff)
         : lanes <= 0 ? static_cast<__mmask16>(0)
                      : static_cast<__mmask16>((1u << lanes) - 1);
}

// Two panels' outputs in one vector, decode's runs (decode_runs in panel_avx2.h) included: panel a's
// in lanes 0-7 (output columns from col_a), panel b's in lanes 8-15 (from col_b; col_a + 8 for
// consecutive panels). The lanes whose outputs exist, of n outputs:
PAGODA_INLINE __mmask16 halves_mask(int64_t col_a, int64_t col_b, int64_t n) {
  return static_cast<__mmask16>((first_lanes(n - col_a) & 0x00ff) | (first_lanes(n - col_b) << kPanelRows));
}

// Stores the lanes of mask of such a vector to y + col_a and y + col_b.
PAGODA_INLINE void store_halves(float* y, int64_t col_a, int64_t col_b, __mmask16 mask, __m512 v) {
  _mm512_mask_storeu_ps(y + col_a, mask & 0x00ff, v);
  if ((mask & 0xff00) != 0) _mm512_mask_storeu_ps(y + col_b - kPanelRows, mask & 0xff00, v);
}

// An R x J tile's running sums, y[r, 16 j + lane] (rows ldy apart), the lanes of mask[j] only:
// loaded where accumulate (zeros in the other lanes), else zeros.
template <int R, int J>
PAGODA_INLINE void load_tile_sums(__m512 (&acc)[R][J], bool accumulate, const float* y, int64_t ldy,
                                  const __mmask16* mask) {
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    unroll<J>([&](auto j) PAGODA_LAMBDA {
      acc[r.value][j.value] = accumulate ? _mm512_maskz_loadu_ps(mask[j.value], y + r.value * ldy + 16 * j.value)
                                         : _mm512_setzero_ps();
    });
  });
}

// Stores them back, the lanes of mask[j] only.
template <int R, int J>
PAGODA_INLINE void store_tile_sums(const __m512 (&acc)[R][J], float* y, int64_t ldy, const __mmask16* mask) {
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    unroll<J>([&](auto j) PAGODA_LAMBDA {
      _mm512_mask_storeu_ps(y + r.value * ldy + 16 * j.value, mask[j.value], acc[r.value][j.value]);
    });
  });
}

}  // namespace
}  // namespace pagoda::cpu
