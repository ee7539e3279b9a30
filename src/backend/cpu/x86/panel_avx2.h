// Helpers of the AVX2 matmul leaf files (matmul_avx2.cpp, int_matmul_avx2.cpp; the AVX-512 ones
// through panel_avx512.h), which work on panels of kPanelRows outputs in the 8 lanes. Include
// only from files built with -mavx2 -mfma -mf16c: every
// function here is AVX2 code with internal linkage (see x86_kernels.h for why a baseline file
// must never see one).
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <utility>  // std::integer_sequence: a type only, emits no code

#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {
namespace {  // internal linkage: each leaf file has its own copies, built with its own flags

#define PAGODA_INLINE inline __attribute__((always_inline))
// On the loops that call the tiles: inline every call below them, the unroll lambdas included
// (GCC does not always, and an out-of-line tile body spills its accumulators on every block).
#define PAGODA_FLATTEN __attribute__((flatten))
// On the lambdas of a tile (the unroll bodies): GCC's flatten does not always reach into a
// generic lambda, and an out-of-line one takes its captured accumulators through memory.
#define PAGODA_LAMBDA __attribute__((always_inline))

template <int S>
struct Idx {
  static constexpr int value = S;
};

// Calls f(Idx<S>{}) for S = 0..N-1, unrolled at compile time.
template <int N, class F>
PAGODA_INLINE void unroll(F&& f) {
  [&]<int... S>(std::integer_sequence<int, S...>) __attribute__((always_inline)) { (f(Idx<S>{}), ...); }
  (std::make_integer_sequence<int, N>{});
}

// Calls f(Idx<R>{}) with R = rows, for rows in [1, kMax] (more than kMax: kMax): a tile of a
// compile-time row count for a run-time one.
template <int kMax, class F>
PAGODA_INLINE void with_rows(int64_t rows, F&& f) {
  unroll<kMax>([&](auto r) __attribute__((always_inline)) {
    if (rows == r.value + 1 || (r.value + 1 == kMax && rows > kMax)) f(Idx<r.value + 1>{});
  });
}

PAGODA_INLINE int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

// Decode (one input row) streams the weights from memory, P panels side by side. The panels
// [p0, p1) are cut into P runs of consecutive panels, and step i takes panel i of each run: each
// of the P streams then reads forward through memory over the whole range, as the hardware
// prefetchers follow best. (P adjacent panels at a time restarted P - 1 streams cold every P
// panels: q4_0 decode on Zen 5, 2 threads, 42 GB/s that way against 52 this way.)
// step(p, run) takes the P panels p, p + run, ..., p + (P - 1) run. Returns where the runs end:
// the fewer than P panels from there to p1 are the caller's.
template <int P, class Step>
PAGODA_INLINE int64_t decode_runs(int64_t p0, int64_t p1, Step&& step) {
  const int64_t run = (p1 - p0) / P;
  for (int64_t i = 0; i < run; ++i) step(p0 + i, run);
  return p0 + run * P;
}

PAGODA_INLINE int32_t load_i32(const void* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// Lanes [0, valid) set: the outputs of a panel that exist (the last panel may be padding).
PAGODA_INLINE __m256i lane_mask(int64_t valid) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(valid)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The running sums of one panel's outputs: y[0, valid), valid in [1, 8].
PAGODA_INLINE __m256 load_out(const float* y, int64_t valid) {
  return valid >= kPanelRows ? _mm256_loadu_ps(y) : _mm256_maskload_ps(y, lane_mask(valid));
}
PAGODA_INLINE void store_out(float* y, __m256 v, int64_t valid) {
  if (valid >= kPanelRows) {
    _mm256_storeu_ps(y, v);
  } else {
    _mm256_maskstore_ps(y, lane_mask(valid), v);
  }
}

// Column t of an f32 / f16 / bf16 panel (element (row c, column t) at t * 8 + c, in the weight's
// own type) as 8 floats, exactly: load(panel + t * 8 * kElemBytes).
struct F32Panel {
  static constexpr int64_t kElemBytes = 4;
  static PAGODA_INLINE __m256 load(const uint8_t* p) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  }
};

struct F16Panel {
  static constexpr int64_t kElemBytes = 2;
  static PAGODA_INLINE __m256 load(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

struct Bf16Panel {
  static constexpr int64_t kElemBytes = 2;
  static PAGODA_INLINE __m256 load(const uint8_t* p) {
    // bf16 is the top half of an f32: widen and shift into place.
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
};

}  // namespace
}  // namespace pagoda::cpu
