// The AVX-512 leaf of the avx512vnni table's matmul for f32 / f16 / bf16 panels in batched
// products (m > 1; decode stays on matmul_packed_rows_avx2, bound by the weight stream), over
// pack_matmul_weight_avx2's panels of 8 rows (x86_kernels.h). Built with -mavx2 -mfma -mf16c
// -mavx512f -mavx512bw -ffp-contract=off; read x86_kernels.h before adding an #include here.
//
// A k slice of four panels is first converted to f32 (exactly) into a buffer that holds, per
// column t, the four panels' 8 weights one after another: 32 floats, two 512-bit vectors (panels
// 0 and 1, panels 2 and 3). A tile of up to 12 input rows then takes one FMA per input row and
// vector per column: 24 accumulators, 16 outputs each. An output's running sum is one FMA chain
// in t order from 0 (stored to y and loaded back between slices), as in matmul_avx2.cpp's
// float_tile: the same bits as the AVX2 leaf, whatever m, the tile shape or the thread split.
#include <immintrin.h>

#include "backend/cpu/x86/panel_avx512.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/check.h"

namespace pagoda::cpu {
namespace {

// Columns per slice: 4 panels' converted slice is 64 KiB, in L2. Each slice reloads and stores
// every output of the thread's share, lines of y that have left the cache by then: 128 columns
// (16 KiB, in L1) left f16 prefill 512 up to 1.2x slower (Zen 5, 2026-12-05).
constexpr int64_t kSlice = 512;
constexpr int kGroupPanels = 4;  // panels per converted slice: two 512-bit vectors per column
constexpr int64_t kColumn = kGroupPanels * kPanelRows;  // floats per column of the buffer
constexpr int kRows = 12;        // input rows per tile: 12 x 2 accumulators, 2 weights

// buf[t * kColumn + 8 q + c] = panel q's weight (row c, column t0 + t) for t < len, q <
// num_panels; the panels missing from a group of four are zeros (their outputs are not stored).
template <class W>
PAGODA_INLINE void convert_slice(const uint8_t* panels, int64_t panel_bytes, int num_panels, int64_t t0,
                                 int64_t len, float* buf) {
  constexpr int64_t kStep = kPanelRows * W::kElemBytes;
  for (int q = 0; q < kGroupPanels; ++q) {
    const uint8_t* src = panels + q * panel_bytes + t0 * kStep;
    float* dst = buf + q * kPanelRows;
    if (q < num_panels) {
      for (int64_t t = 0; t < len; ++t) _mm256_store_ps(dst + t * kColumn, W::load(src + t * kStep));
    } else {
      for (int64_t t = 0; t < len; ++t) _mm256_store_ps(dst + t * kColumn, _mm256_setzero_ps());
    }
  }
}

// y[r, 16 j + lane] (+)= sum over t < len of x[r, t] * buf[t * kColumn + 16 j + lane], for R
// input rows (ldx apart) and J vectors of the buffer, lanes of mask[j] only. accumulate:
// continue the running sums already in y.
template <int R, int J>
PAGODA_INLINE void tile(const float* x, int64_t ldx, const float* buf, int64_t len, bool accumulate, float* y,
                        int64_t ldy, const __mmask16* mask) {
  __m512 acc[R][J];
  load_tile_sums<R, J>(acc, accumulate, y, ldy, mask);
  for (int64_t t = 0; t < len; ++t) {
    __m512 w[J];
    unroll<J>([&](auto j) PAGODA_LAMBDA { w[j.value] = _mm512_load_ps(buf + t * kColumn + 16 * j.value); });
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      const __m512 xv = _mm512_set1_ps(x[r.value * ldx + t]);
      unroll<J>([&](auto j) PAGODA_LAMBDA {
        acc[r.value][j.value] = _mm512_fmadd_ps(xv, w[j.value], acc[r.value][j.value]);
      });
    });
  }
  store_tile_sums<R, J>(acc, y, ldy, mask);
}

// Every group of input rows over the converted slice: J = 1 where the group's panels fit in one
// vector (a last group of one or two panels), else 2.
template <int J>
PAGODA_INLINE void slice_all_rows(const float* x, int64_t m, int64_t ldx, const float* buf, int64_t len,
                                  bool accumulate, float* y, int64_t ldy, const __mmask16* mask) {
  for (int64_t i = 0; i < m; i += kRows) {
    const float* xi = x + i * ldx;
    float* yi = y + i * ldy;
    with_rows<kRows>(m - i, [&](auto rows) PAGODA_LAMBDA {
      tile<rows.value, J>(xi, ldx, buf, len, accumulate, yi, ldy, mask);
    });
  }
}

template <class W>
PAGODA_FLATTEN void float_rows(const float* x, int64_t m, int64_t k, const uint8_t* panels, int64_t n, float* y,
                               int64_t ldy, int64_t p0, int64_t p1) {
  const int64_t panel_bytes = k * kPanelRows * W::kElemBytes;
  alignas(64) float buf[kSlice * kColumn];  // 64 KiB
  for (int64_t t0 = 0; t0 < k; t0 += kSlice) {
    const int64_t len = min64(k, t0 + kSlice) - t0;
    const bool accumulate = t0 > 0;
    for (int64_t p = p0; p < p1; p += kGroupPanels) {
      const int num_panels = static_cast<int>(min64(p1 - p, kGroupPanels));
      convert_slice<W>(panels + p * panel_bytes, panel_bytes, num_panels, t0, len, buf);
      // The outputs of the group that exist: from panel p's first row to n, at most its panels'.
      const int64_t valid = min64(n - p * kPanelRows, num_panels * kPanelRows);
      const __mmask16 mask[2] = {first_lanes(valid), first_lanes(valid - 16)};
      float* yp = y + p * kPanelRows;
      if (num_panels <= 2) {
        slice_all_rows<1>(x + t0, m, k, buf, len, accumulate, yp, ldy, mask);
      } else {
        slice_all_rows<2>(x + t0, m, k, buf, len, accumulate, yp, ldy, mask);
      }
    }
  }
}

}  // namespace

void matmul_float_batched_avx512(const float* x, int64_t m, int64_t k, DType type, const void* panels, int64_t n,
                                 float* y, int64_t ldy, int64_t panel_begin, int64_t panel_end) {
  const auto* w = static_cast<const uint8_t*>(panels);
  switch (type) {
    case DType::kF32: return float_rows<F32Panel>(x, m, k, w, n, y, ldy, panel_begin, panel_end);
    case DType::kF16: return float_rows<F16Panel>(x, m, k, w, n, y, ldy, panel_begin, panel_end);
    case DType::kBF16: return float_rows<Bf16Panel>(x, m, k, w, n, y, ldy, panel_begin, panel_end);
    default: break;
  }
  PAGODA_CHECK(false && "matmul_float_batched_avx512 takes f32, f16 or bf16 panels");
}

}  // namespace pagoda::cpu
