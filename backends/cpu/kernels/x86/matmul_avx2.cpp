// The AVX2 + FMA + F16C matmul leaf loops, built with those flags (see backends/cpu/CMakeLists.txt);
// read x86_kernels.h before adding an #include here.
//
// Shape of the computation: each output y[i, j] is a dot product of input row i with weight row
// j, so weights are read in their stored layout and converted in registers. A register tile holds
// R input rows x C weight rows of 8-lane accumulators: each converted weight vector feeds R
// products and each loaded input vector C.
//  - f32 / f16 / bf16 weights: converted to f32, 8 at a time, and FMAs.
//  - q8_0 / q4_0 weights: int8 dot products with the activations quantized per 32-element block
//    (BlockQ8Act), one scale multiply per block instead of one per element.
//  - m = 1 (decode) is memory-bound: R = 1, C = 3..4 streams several weight rows at once, each
//    read once.
//  - m > 4 (batched): weight rows are taken 16 at a time (f32 types: and their k range in slices
//    small enough to stay in L1) while every group of 4 input rows passes over them.
// Every output is summed in the same order for any m, any tile shape and any row split over
// threads: the same input row gives the same bits alone or in a batch.
#include <immintrin.h>

#include <cstddef>
#include <utility>  // std::integer_sequence: a type only, emits no code

#include "backends/cpu/kernels/x86/x86_kernels.h"
#include "base/check.h"
#include "tensor/quant_blocks.h"

namespace pagoda::cpu {
namespace {

#define PAGODA_INLINE inline __attribute__((always_inline))

constexpr int64_t kRowBlock = 16;  // weight rows that share one pass over the input rows
constexpr int kMaxInputRows = 4;   // input rows per register tile

int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <int S>
struct Idx {
  static constexpr int value = S;
};

// Calls f(Idx<S>{}) for S = 0..N-1, unrolled at compile time.
template <int N, class F>
PAGODA_INLINE void unroll(F&& f) {
  [&]<int... S>(std::integer_sequence<int, S...>) { (f(Idx<S>{}), ...); }
  (std::make_integer_sequence<int, N>{});
}

PAGODA_INLINE float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

PAGODA_INLINE uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  __builtin_memcpy(&v, p, 2);
  return v;
}

// Weight readers. A row is read in blocks of kBlock elements (a multiple of 8): block(row, b)
// prepares block b, load<S>(block) converts its elements [8S, 8S + 8) to f32. Plain types also
// give scalar(row, t) for the k % 8 tail; quantized rows have no tail (k % 32 == 0).
struct F32Weights {
  static constexpr int kBlock = 8;
  static constexpr int64_t kSlice = 512;  // k slice for batched inputs: 16 rows x 2 KiB
  static constexpr int kBlockRegs = 0;    // ymm registers one prepared Block holds
  struct Block {
    const float* p;
  };
  static PAGODA_INLINE Block block(const uint8_t* row, int64_t b) {
    return {reinterpret_cast<const float*>(row) + b * kBlock};
  }
  template <int S>
  static PAGODA_INLINE __m256 load(const Block& blk) {
    return _mm256_loadu_ps(blk.p);
  }
  static PAGODA_INLINE float scalar(const uint8_t* row, int64_t t) {
    return reinterpret_cast<const float*>(row)[t];
  }
};

struct F16Weights {
  static constexpr int kBlock = 8;
  static constexpr int64_t kSlice = 512;  // k slice for batched inputs: 16 rows x 1 KiB
  static constexpr int kBlockRegs = 0;    // ymm registers one prepared Block holds
  struct Block {
    const uint16_t* p;
  };
  static PAGODA_INLINE Block block(const uint8_t* row, int64_t b) {
    return {reinterpret_cast<const uint16_t*>(row) + b * kBlock};
  }
  template <int S>
  static PAGODA_INLINE __m256 load(const Block& blk) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.p)));
  }
  static PAGODA_INLINE float scalar(const uint8_t* row, int64_t t) {
    return _cvtsh_ss(reinterpret_cast<const uint16_t*>(row)[t]);
  }
};

struct Bf16Weights {
  static constexpr int kBlock = 8;
  static constexpr int64_t kSlice = 512;  // k slice for batched inputs: 16 rows x 1 KiB
  static constexpr int kBlockRegs = 0;    // ymm registers one prepared Block holds
  struct Block {
    const uint16_t* p;
  };
  static PAGODA_INLINE Block block(const uint8_t* row, int64_t b) {
    return {reinterpret_cast<const uint16_t*>(row) + b * kBlock};
  }
  template <int S>
  static PAGODA_INLINE __m256 load(const Block& blk) {
    // bf16 is the top half of an f32: widen and shift into place.
    __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk.p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static PAGODA_INLINE float scalar(const uint8_t* row, int64_t t) {
    uint32_t bits = static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[t]) << 16;
    float f;
    __builtin_memcpy(&f, &bits, 4);
    return f;
  }
};

// One register tile: y[r, c] (+)= sum over t in [k0, k1) of x[r, t] * w[c, t] for r < R, c < C.
// x rows are ldx apart, w rows w_row_bytes apart, y rows ldy apart. k0 is a multiple of
// W::kBlock; the elements past the last whole block (plain types only) are summed in scalar.
template <class W, int R, int C>
PAGODA_INLINE void tile(const float* x, int64_t ldx, const uint8_t* w, int64_t w_row_bytes,
                        int64_t k0, int64_t k1, bool accumulate, float* y, int64_t ldy) {
  __m256 acc[R][C];
  unroll<R>(
      [&](auto r) { unroll<C>([&](auto c) { acc[r.value][c.value] = _mm256_setzero_ps(); }); });
  const int64_t b1 = k1 / W::kBlock;
  for (int64_t b = k0 / W::kBlock; b < b1; ++b) {
    typename W::Block blk[C];
    unroll<C>([&](auto c) { blk[c.value] = W::block(w + c.value * w_row_bytes, b); });
    const float* xb = x + b * W::kBlock;
    unroll<W::kBlock / 8>([&](auto s) {
      __m256 wv[C];
      unroll<C>([&](auto c) { wv[c.value] = W::template load<decltype(s)::value>(blk[c.value]); });
      unroll<R>([&](auto r) {
        const __m256 xv = _mm256_loadu_ps(xb + r.value * ldx + s.value * 8);
        unroll<C>([&](auto c) {
          acc[r.value][c.value] = _mm256_fmadd_ps(xv, wv[c.value], acc[r.value][c.value]);
        });
      });
    });
  }
  unroll<R>([&](auto r) {
    unroll<C>([&](auto c) {
      float sum = hsum(acc[r.value][c.value]);
      for (int64_t t = b1 * W::kBlock; t < k1; ++t) {
        sum += x[r.value * ldx + t] * W::scalar(w + c.value * w_row_bytes, t);
      }
      float& out = y[r.value * ldy + c.value];
      out = accumulate ? out + sum : sum;
    });
  });
}

// How many weight rows (up to 4) one tile of R input rows takes: as many as the 16 ymm registers
// hold with R x C accumulators, C converted weight vectors, C x kBlockRegs per-block constants and
// one input vector.
template <class W, int R>
constexpr int tile_columns() {
  constexpr int kFit = 15 / (R + 1 + W::kBlockRegs);
  return kFit < 4 ? kFit : 4;
}

// R input rows against weight rows [j0, j1) over the k slice [k0, k1), C weight rows at a time,
// then one by one.
template <class W, int R>
void tile_row_range(const float* x, int64_t ldx, const uint8_t* w, int64_t w_row_bytes, int64_t j0,
                    int64_t j1, int64_t k0, int64_t k1, bool accumulate, float* y, int64_t ldy) {
  constexpr int C = tile_columns<W, R>();
  int64_t j = j0;
  for (; j + C <= j1; j += C) {
    tile<W, R, C>(x, ldx, w + j * w_row_bytes, w_row_bytes, k0, k1, accumulate, y + j, ldy);
  }
  for (; j < j1; ++j) {
    tile<W, R, 1>(x, ldx, w + j * w_row_bytes, w_row_bytes, k0, k1, accumulate, y + j, ldy);
  }
}

// Like tile_row_range over every slice of k, but each group of C weight rows goes through all its
// slices before the next group: the rows stream from memory front to back (decode is bound by
// that stream), and every output sees exactly the slices and sums of the batched order.
template <class W, int R>
void tile_row_range_all_slices(const float* x, int64_t ldx, int64_t k, const uint8_t* w,
                               int64_t w_row_bytes, int64_t j0, int64_t j1, float* y, int64_t ldy) {
  constexpr int C = tile_columns<W, R>();
  int64_t j = j0;
  for (; j + C <= j1; j += C) {
    for (int64_t k0 = 0; k0 < k; k0 += W::kSlice) {
      tile<W, R, C>(x, ldx, w + j * w_row_bytes, w_row_bytes, k0, min64(k, k0 + W::kSlice), k0 > 0,
                    y + j, ldy);
    }
  }
  for (; j < j1; ++j) {
    for (int64_t k0 = 0; k0 < k; k0 += W::kSlice) {
      tile<W, R, 1>(x, ldx, w + j * w_row_bytes, w_row_bytes, k0, min64(k, k0 + W::kSlice), k0 > 0,
                    y + j, ldy);
    }
  }
}

template <class W>
void rows(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t w_row_bytes, float* y,
          int64_t ldy, int64_t row_begin, int64_t row_end) {
  // Every output is summed the same way whatever m is (batch invariance): 8 lanes of FMAs over
  // each k slice of W::kSlice, the slice's horizontal sum added to the previous slices' in order.
  // Only the loop order differs. With one group of input rows there is no reuse to block for:
  // each weight row streams once through all its slices. With more, a k slice of kRowBlock weight
  // rows stays in L1/L2 while every input-row group passes over it. Slice lengths were tuned on
  // Zen 2 (shorter ones lose more to the per-slice horizontal sums and y updates than they gain
  // in locality).
  if (m <= kMaxInputRows) {
    switch (m) {
      case 1:
        return tile_row_range_all_slices<W, 1>(x, k, k, w, w_row_bytes, row_begin, row_end, y, ldy);
      case 2:
        return tile_row_range_all_slices<W, 2>(x, k, k, w, w_row_bytes, row_begin, row_end, y, ldy);
      case 3:
        return tile_row_range_all_slices<W, 3>(x, k, k, w, w_row_bytes, row_begin, row_end, y, ldy);
      default:
        return tile_row_range_all_slices<W, 4>(x, k, k, w, w_row_bytes, row_begin, row_end, y, ldy);
    }
  }
  for (int64_t j0 = row_begin; j0 < row_end; j0 += kRowBlock) {
    const int64_t j1 = min64(row_end, j0 + kRowBlock);
    for (int64_t k0 = 0; k0 < k; k0 += W::kSlice) {
      const int64_t k1 = min64(k, k0 + W::kSlice);
      const bool accumulate = k0 > 0;
      for (int64_t i = 0; i < m; i += kMaxInputRows) {
        const float* xi = x + i * k;
        float* yi = y + i * ldy;
        switch (min64(m - i, kMaxInputRows)) {
          case 1:
            tile_row_range<W, 1>(xi, k, w, w_row_bytes, j0, j1, k0, k1, accumulate, yi, ldy);
            break;
          case 2:
            tile_row_range<W, 2>(xi, k, w, w_row_bytes, j0, j1, k0, k1, accumulate, yi, ldy);
            break;
          case 3:
            tile_row_range<W, 3>(xi, k, w, w_row_bytes, j0, j1, k0, k1, accumulate, yi, ldy);
            break;
          default:
            tile_row_range<W, 4>(xi, k, w, w_row_bytes, j0, j1, k0, k1, accumulate, yi, ldy);
            break;
        }
      }
    }
  }
}

// ---- Q8_0 / Q4_0 weights against activations quantized to BlockQ8Act: int8 dot products ----
//
// Per 32-element block: the weights as 32 signed bytes, the activation's 32 signed bytes, and
// vpmaddubsw (unsigned x signed byte pairs -> int16) made signed by the usual sign trick:
// |x| times (w with x's sign) is w * x, at most 128 * 127 per byte, so the pair sums cannot
// saturate. vpmaddwd against ones widens to 8 int32 lanes, exact; converted to f32 they are scaled
// by d_w * d_x and accumulated in 8 f32 lanes, one FMA per block; the lanes are summed at the end.
// The order is the same for every tile shape, so outputs do not depend on m.

struct Q8Blocks {
  static PAGODA_INLINE __m256i qs(const uint8_t* row, int64_t b) {
    const uint8_t* p = row + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + offsetof(BlockQ8_0, qs)));
  }
  static PAGODA_INLINE float d(const uint8_t* row, int64_t b) {
    return _cvtsh_ss(load_u16(row + b * static_cast<int64_t>(sizeof(BlockQ8_0))));
  }
};

// Q4_0: byte j holds element j in its low nibble and element j + 16 in its high one, so the low
// nibbles fill the low 128 bits and the high nibbles the high 128 bits, in element order.
struct Q4Blocks {
  static PAGODA_INLINE __m256i qs(const uint8_t* row, int64_t b) {
    const uint8_t* p = row + b * static_cast<int64_t>(sizeof(BlockQ4_0));
    const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + offsetof(BlockQ4_0, qs)));
    const __m256i both = _mm256_set_m128i(_mm_srli_epi16(bytes, 4), bytes);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0f)), _mm256_set1_epi8(8));
  }
  static PAGODA_INLINE float d(const uint8_t* row, int64_t b) {
    return _cvtsh_ss(load_u16(row + b * static_cast<int64_t>(sizeof(BlockQ4_0))));
  }
};

// The 8 int32 lane sums of w * x over one block.
PAGODA_INLINE __m256i dot_block(__m256i w, __m256i x, __m256i abs_x) {
  const __m256i pairs = _mm256_maddubs_epi16(abs_x, _mm256_sign_epi8(w, x));
  return _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
}

// y[r, c] = sum over all nb blocks for R activation rows (nb blocks apart) x C weight rows.
template <class W, int R, int C>
PAGODA_INLINE void qtile(const BlockQ8Act* x, int64_t nb, const uint8_t* w, int64_t w_row_bytes,
                         float* y, int64_t ldy) {
  __m256 acc[R][C];
  unroll<R>(
      [&](auto r) { unroll<C>([&](auto c) { acc[r.value][c.value] = _mm256_setzero_ps(); }); });
  for (int64_t b = 0; b < nb; ++b) {
    __m256i wq[C];
    __m256 wd[C];
    unroll<C>([&](auto c) {
      wq[c.value] = W::qs(w + c.value * w_row_bytes, b);
      wd[c.value] = _mm256_set1_ps(W::d(w + c.value * w_row_bytes, b));
    });
    unroll<R>([&](auto r) {
      const BlockQ8Act& xb = x[r.value * nb + b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.qs));
      const __m256i abs_x = _mm256_sign_epi8(xq, xq);
      const __m256 xd = _mm256_set1_ps(xb.d);
      unroll<C>([&](auto c) {
        const __m256 dot = _mm256_cvtepi32_ps(dot_block(wq[c.value], xq, abs_x));
        acc[r.value][c.value] =
            _mm256_fmadd_ps(dot, _mm256_mul_ps(wd[c.value], xd), acc[r.value][c.value]);
      });
    });
  }
  unroll<R>([&](auto r) {
    unroll<C>([&](auto c) { y[r.value * ldy + c.value] = hsum(acc[r.value][c.value]); });
  });
}

// Registers: R x C accumulators, C weight vectors and C scales, and the input's three.
template <int R>
constexpr int qtile_columns() {
  constexpr int kFit = (16 - 3) / (R + 2);
  return kFit < 4 ? kFit : 4;
}

template <class W, int R>
void qtile_row_range(const BlockQ8Act* x, int64_t nb, const uint8_t* w, int64_t w_row_bytes,
                     int64_t j0, int64_t j1, float* y, int64_t ldy) {
  constexpr int C = qtile_columns<R>();
  int64_t j = j0;
  for (; j + C <= j1; j += C) qtile<W, R, C>(x, nb, w + j * w_row_bytes, w_row_bytes, y + j, ldy);
  for (; j < j1; ++j) qtile<W, R, 1>(x, nb, w + j * w_row_bytes, w_row_bytes, y + j, ldy);
}

template <class W>
void qrows(const BlockQ8Act* x, int64_t m, int64_t nb, const uint8_t* w, int64_t w_row_bytes,
           float* y, int64_t ldy, int64_t row_begin, int64_t row_end) {
  // Weight rows in blocks of kRowBlock, each block's rows (a few KiB to tens of KiB) staying in
  // L1/L2 while every group of input rows passes over them.
  for (int64_t j0 = row_begin; j0 < row_end; j0 += kRowBlock) {
    const int64_t j1 = min64(row_end, j0 + kRowBlock);
    for (int64_t i = 0; i < m; i += kMaxInputRows) {
      const BlockQ8Act* xi = x + i * nb;
      float* yi = y + i * ldy;
      switch (min64(m - i, kMaxInputRows)) {
        case 1:
          qtile_row_range<W, 1>(xi, nb, w, w_row_bytes, j0, j1, yi, ldy);
          break;
        case 2:
          qtile_row_range<W, 2>(xi, nb, w, w_row_bytes, j0, j1, yi, ldy);
          break;
        case 3:
          qtile_row_range<W, 3>(xi, nb, w, w_row_bytes, j0, j1, yi, ldy);
          break;
        default:
          qtile_row_range<W, 4>(xi, nb, w, w_row_bytes, j0, j1, yi, ldy);
          break;
      }
    }
  }
}

}  // namespace

void matmul_rows_avx2(const float* x, int64_t m, int64_t k, DType w_type, const void* w,
                      int64_t w_row_bytes, float* y, int64_t ldy, int64_t row_begin,
                      int64_t row_end) {
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (w_type) {
    case DType::kF32:
      return rows<F32Weights>(x, m, k, wb, w_row_bytes, y, ldy, row_begin, row_end);
    case DType::kF16:
      return rows<F16Weights>(x, m, k, wb, w_row_bytes, y, ldy, row_begin, row_end);
    case DType::kBF16:
      return rows<Bf16Weights>(x, m, k, wb, w_row_bytes, y, ldy, row_begin, row_end);
    case DType::kQ8_0:
    case DType::kQ4_0:
      break;
  }
  PAGODA_CHECK(false && "matmul_rows_avx2 takes f32, f16 or bf16 weights");
}

void quantize_activation_rows_avx2(const float* x, int64_t m, int64_t k, BlockQ8Act* out) {
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
      unroll<4>([&](auto s) { v[s.value] = _mm256_loadu_ps(xb + 8 * s.value); });
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
      unroll<4>([&](auto s) { q[s.value] = _mm256_cvtps_epi32(_mm256_mul_ps(v[s.value], scale)); });
      const __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.qs), _mm256_permutevar8x32_epi32(q16, order));
    }
  }
}

void matmul_q8act_rows_avx2(const BlockQ8Act* x, int64_t m, int64_t k, DType w_type, const void* w,
                            int64_t w_row_bytes, float* y, int64_t ldy, int64_t row_begin,
                            int64_t row_end) {
  PAGODA_CHECK(k % kQuantBlock == 0);
  const auto* wb = static_cast<const uint8_t*>(w);
  const int64_t nb = k / kQuantBlock;
  if (w_type == DType::kQ8_0) return qrows<Q8Blocks>(x, m, nb, wb, w_row_bytes, y, ldy, row_begin, row_end);
  if (w_type == DType::kQ4_0) return qrows<Q4Blocks>(x, m, nb, wb, w_row_bytes, y, ldy, row_begin, row_end);
  PAGODA_CHECK(false && "matmul_q8act_rows_avx2 takes q8_0 or q4_0 weights");
}

}  // namespace pagoda::cpu
