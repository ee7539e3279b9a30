// The AVX2 + FMA + F16C matmul leaf loop. This is the only file built with those flags (see
// backends/cpu/CMakeLists.txt); read x86_kernels.h before adding an #include here.
//
// Shape of the computation: each output y[i, j] is a dot product of input row i with weight row
// j, so weights are read in their stored layout and converted to f32 in registers, 8 at a time.
// A register tile holds R input rows x C weight rows of 8-lane accumulators: each converted
// weight vector feeds R FMAs and each loaded input vector C FMAs.
//  - m = 1 (decode) is memory-bound: R = 1, C = 3..4 streams several weight rows at once, each
//    read once.
//  - m > 4 (batched): weight rows are taken 16 at a time and their k range in slices small
//    enough to stay in L1 while every group of 4 input rows passes over them; partial sums of
//    later slices are added into y.
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

// Q8_0: w = d * q. Multiplying by d per element (rather than per block sum) gives exactly the
// reference's dequantized value, so only the summation order differs from it.
struct Q8Weights {
  static constexpr int kBlock = kQuantBlock;
  static constexpr int64_t kSlice = 512;  // k slice for batched inputs: 16 rows x 544 B
  static constexpr int kBlockRegs = 1;
  struct Block {
    const uint8_t* qs;
    __m256 d;
  };
  static PAGODA_INLINE Block block(const uint8_t* row, int64_t b) {
    const uint8_t* p = row + b * static_cast<int64_t>(sizeof(BlockQ8_0));
    return {p + offsetof(BlockQ8_0, qs), _mm256_set1_ps(_cvtsh_ss(load_u16(p)))};
  }
  template <int S>
  static PAGODA_INLINE __m256 load(const Block& blk) {
    __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.qs + 8 * S));
    return _mm256_mul_ps(blk.d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)));
  }
  static PAGODA_INLINE float scalar(const uint8_t*, int64_t) { return 0; }  // no tail
};

// Q4_0: w = d * (nibble - 8). Elements 0..15 are the low nibbles of bytes 0..15 and elements
// 16..31 the high nibbles, so 8 elements [8S, 8S + 8) come from bytes 8(S % 2) .. + 8. The
// offset is folded into one FMA: nibble * d + (-8d) is d * (nibble - 8) rounded once (-8d is
// exact), the reference's value.
struct Q4Weights {
  static constexpr int kBlock = kQuantBlock;
  static constexpr int64_t kSlice = 1024;  // k slice for batched inputs: 16 rows x 576 B
  static constexpr int kBlockRegs = 2;
  struct Block {
    const uint8_t* qs;
    __m256 d;
    __m256 minus_8d;
  };
  static PAGODA_INLINE Block block(const uint8_t* row, int64_t b) {
    const uint8_t* p = row + b * static_cast<int64_t>(sizeof(BlockQ4_0));
    const float d = _cvtsh_ss(load_u16(p));
    return {p + offsetof(BlockQ4_0, qs), _mm256_set1_ps(d), _mm256_set1_ps(-8.0f * d)};
  }
  template <int S>
  static PAGODA_INLINE __m256 load(const Block& blk) {
    __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blk.qs + 8 * (S % 2)));
    __m256i v = _mm256_cvtepu8_epi32(bytes);
    v = S < 2 ? _mm256_and_si256(v, _mm256_set1_epi32(0x0f)) : _mm256_srli_epi32(v, 4);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(v), blk.d, blk.minus_8d);
  }
  static PAGODA_INLINE float scalar(const uint8_t*, int64_t) { return 0; }  // no tail
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

// R input rows against weight rows [j0, j1), C at a time, then one by one.
template <class W, int R>
void tile_row_range(const float* x, int64_t ldx, const uint8_t* w, int64_t w_row_bytes, int64_t j0,
                    int64_t j1, int64_t k0, int64_t k1, bool accumulate, float* y, int64_t ldy) {
  // As many weight rows (up to 4) as the 16 ymm registers hold: R x C accumulators, C converted
  // weight vectors, C x kBlockRegs per-block constants, one input vector.
  constexpr int kFit = 15 / (R + 1 + W::kBlockRegs);
  constexpr int C = kFit < 4 ? kFit : 4;
  int64_t j = j0;
  for (; j + C <= j1; j += C) {
    tile<W, R, C>(x, ldx, w + j * w_row_bytes, w_row_bytes, k0, k1, accumulate, y + j, ldy);
  }
  for (; j < j1; ++j) {
    tile<W, R, 1>(x, ldx, w + j * w_row_bytes, w_row_bytes, k0, k1, accumulate, y + j, ldy);
  }
}

template <class W>
void rows(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t w_row_bytes, float* y,
          int64_t ldy, int64_t row_begin, int64_t row_end) {
  // With one group of input rows there is no reuse to block for: one pass over whole rows. With
  // more, a k slice of kRowBlock weight rows stays in L1/L2 while every input-row group passes
  // over it. Slice lengths were tuned on Zen 2 (shorter ones lose more to the per-slice
  // horizontal sums and y updates than they gain in locality).
  const int64_t slice = m <= kMaxInputRows ? k : W::kSlice;
  for (int64_t j0 = row_begin; j0 < row_end; j0 += kRowBlock) {
    const int64_t j1 = min64(row_end, j0 + kRowBlock);
    for (int64_t k0 = 0; k0 < k; k0 += slice) {
      const int64_t k1 = min64(k, k0 + slice);
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
      PAGODA_CHECK(k % kQuantBlock == 0);
      return rows<Q8Weights>(x, m, k, wb, w_row_bytes, y, ldy, row_begin, row_end);
    case DType::kQ4_0:
      PAGODA_CHECK(k % kQuantBlock == 0);
      return rows<Q4Weights>(x, m, k, wb, w_row_bytes, y, ldy, row_begin, row_end);
  }
  PAGODA_CHECK(false && "unknown weight type");
}

}  // namespace pagoda::cpu
