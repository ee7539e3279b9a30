// The AVX-512 VNNI leaf of the avx512vnni table's matmul for q8_0 weights in batched products (m >
// 1; decode and the other block types take the avxvnni leaves). The panels are
// pack_matmul_weight_avx2's (x86_kernels.h): per 32-element block, the 8 rows' fp16 scales, then
// 8 groups of 32 bytes, each the 4 int8 weights of every row. Two panels per 512-bit vector, p in
// the low half and p + 1 in the high half, so a vpdpbusd is a 4-column step of 16 output rows.
// Built with -mavx2 -mfma -mf16c -mavx512f -mavx512bw -mavx512vnni -ffp-contract=off; read
// x86_kernels.h before adding an #include here.
//
// As in int_matmul_avx512vnni.cpp, the input codes come unsigned (x + 128, made so by the
// driver), a step is one vpdpbusd per input row, and each block's 128 * sum(w), one more
// vpdpbusd per step that the tile's input rows share, comes off its dot: the block's exact
// integer dot, then acc + float(dot) * (d_w * d_x), the reference's order and rounding, bit for
// bit (matmul_avx2.cpp's quant_tile, on 16 rows).
#include <immintrin.h>

#include "backends/cpu/kernels/x86/panel_avx2.h"
#include "backends/cpu/kernels/x86/x86_kernels.h"
#include "tensor/quant_blocks.h"

namespace pagoda::cpu {
namespace {

constexpr int64_t kBlockBytes = 16 + 8 * kQuantBlock;  // a q8_0 panel's block
constexpr int64_t kBlockSlice = 16;                    // blocks per k slice (8.5 KiB of a panel pair)
constexpr int kRows = 8;                               // input rows per tile

PAGODA_INLINE __m512i load_pair(const uint8_t* a, const uint8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}

// The 16 rows' fp16 scales of a block of each panel, as floats.
PAGODA_INLINE __m512 scales_pair(const uint8_t* a, const uint8_t* b) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  return _mm512_cvtph_ps(h);
}

// y[r, lanes of mask] (+)= the blocks [b0, b1) of R input rows (row r's blocks at x + r * nb, codes
// unsigned) against panels a and b. accumulate: continue the running sums already in y.
template <int R>
PAGODA_INLINE void q8_tile(const BlockQ8Act* x, int64_t nb, const uint8_t* a, const uint8_t* b, int64_t b0,
                           int64_t b1, bool accumulate, float* y, int64_t ldy, __mmask16 mask) {
  __m512 acc[R];
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    acc[r.value] = accumulate ? _mm512_maskz_loadu_ps(mask, y + r.value * ldy) : _mm512_setzero_ps();
  });
  const __m512i bias = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t blk = b0; blk < b1; ++blk) {
    const uint8_t* wa = a + blk * kBlockBytes;
    const uint8_t* wb = b + blk * kBlockBytes;
    __m512i dot[R];
    unroll<R>([&](auto r) PAGODA_LAMBDA { dot[r.value] = _mm512_setzero_si512(); });
    __m512i wsum = _mm512_setzero_si512();  // 128 * sum(w) per lane
    unroll<8>([&](auto g) PAGODA_LAMBDA {
      const __m512i w = load_pair(wa + 16 + 32 * g.value, wb + 16 + 32 * g.value);
      wsum = _mm512_dpbusd_epi32(wsum, bias, w);
      unroll<R>([&](auto r) PAGODA_LAMBDA {
        const __m512i xv = _mm512_set1_epi32(load_i32(x[r.value * nb + blk].qs + 4 * g.value));
        dot[r.value] = _mm512_dpbusd_epi32(dot[r.value], xv, w);
      });
    });
    const __m512 d_w = scales_pair(wa, wb);
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      const __m512 d = _mm512_mul_ps(d_w, _mm512_set1_ps(x[r.value * nb + blk].d));
      const __m512i exact = _mm512_sub_epi32(dot[r.value], wsum);
      acc[r.value] = _mm512_add_ps(acc[r.value], _mm512_mul_ps(_mm512_cvtepi32_ps(exact), d));
    });
  }
  unroll<R>([&](auto r) PAGODA_LAMBDA { _mm512_mask_storeu_ps(y + r.value * ldy, mask, acc[r.value]); });
}

}  // namespace

PAGODA_FLATTEN void matmul_q8_0_unsigned_avx512vnni(const BlockQ8Act* x, int64_t m, int64_t k, const void* panels,
                                                    int64_t n, float* y, int64_t ldy, int64_t panel_begin,
                                                    int64_t panel_end) {
  const int64_t nb = k / kQuantBlock, panel_bytes = nb * kBlockBytes;
  const auto* w = static_cast<const uint8_t*>(panels);
  for (int64_t b0 = 0; b0 < nb; b0 += kBlockSlice) {
    const int64_t b1 = b0 + kBlockSlice < nb ? b0 + kBlockSlice : nb;
    const bool accumulate = b0 > 0;
    for (int64_t p = panel_begin; p < panel_end; p += 2) {
      // Panels p and p + 1, or p alone (its second half repeated, not stored).
      const int64_t q = p + 1 < panel_end ? p + 1 : p;
      int64_t valid = n - p * kPanelRows;
      if (q == p && valid > kPanelRows) valid = kPanelRows;
      const __mmask16 mask = valid >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << valid) - 1);
      const uint8_t* a = w + p * panel_bytes;
      const uint8_t* b = w + q * panel_bytes;
      for (int64_t i = 0; i < m; i += kRows) {
        const BlockQ8Act* xi = x + i * nb;
        float* yi = y + i * ldy + p * kPanelRows;
        switch (m - i < kRows ? m - i : kRows) {
          case 1: q8_tile<1>(xi, nb, a, b, b0, b1, accumulate, yi, ldy, mask); break;
          case 2: q8_tile<2>(xi, nb, a, b, b0, b1, accumulate, yi, ldy, mask); break;
          case 3: q8_tile<3>(xi, nb, a, b, b0, b1, accumulate, yi, ldy, mask); break;
          case 4: q8_tile<4>(xi, nb, a, b, b0, b1, accumulate, yi, ldy, mask); break;
          case 5: q8_tile<5>(xi, nb, a, b, b0, b1, accumulate, yi, ldy, mask); break;
          case 6: q8_tile<6>(xi, nb, a, b, b0, b1, accumulate, yi, ldy, mask); break;
          case 7: q8_tile<7>(xi, nb, a, b, b0, b1, accumulate, yi, ldy, mask); break;
          default: q8_tile<8>(xi, nb, a, b, b0, b1, accumulate, yi, ldy, mask); break;
        }
      }
    }
  }
}

}  // namespace pagoda::cpu
