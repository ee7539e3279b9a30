// The avx512bf16 table's matmul leaf for f16 and bf16 weights, every m (decode too, so that a
// row's result never depends on the batch around it), on vdpbf16ps, over the panels of 8 rows of
// pack_matmul_weight_avx512bf16 (pack_matmul_weight_avx2's, f16 values stored rounded to bf16;
// x86_kernels.h). Built with -mavx2 -mfma -mf16c -mavx512f -mavx512bw
// -mavx512bf16 -ffp-contract=off; read x86_kernels.h before adding an #include here.
//
// vdpbf16ps multiplies pairs of bf16 values (exactly: 8 x 8 significant bits fit an f32) and adds
// both products into an f32 lane: lane += odd product, then lane += even product, each sum
// rounded to nearest even, denormals read and written as zero. So the inputs are rounded to bf16
// first (convert_rows_bf16_avx512bf16) and so are f16 weights, once, when they are packed (bf16
// weights are exact; converted in the loops, f16 took 1.4x bf16's time at 6 rows from the cache,
// 54 against 78 GB/s of weights, Zen 5): with xb
// and wb those values, an output is, bit for bit whatever m, the tile or the thread split:
//   acc = 0; for each column pair u in order: acc = (acc + xb[2u+1] * wb[2u+1]) + xb[2u] * wb[2u]
// (column 2u + 1 of an odd k is 0). Against the exact f32 product each term is off by at most
// about 2^-8 of itself (both factors rounded to 8 significant bits); the tests hold the leaf to the
// formula above bit for bit and to 2^-7 of sum |x w| against the float64 product.
//
// Weights reach the dot as each row's bf16 pairs of columns (2u, 2u + 1), 16 rows (two panels)
// per 512-bit vector: four columns of a panel are loaded at once, and one
// vpermt2w per pair interleaves two panels' columns (two_pairs). Up to kDirectMaxRows input rows
// (decode, small batches) take them straight from the panels as they stream by; more rows take a
// k slice of a group of four panels from a buffer that holds it so interleaved, filled once per
// slice, with tiles of up to 12 input rows. Each row's pair is broadcast as one dword.
#include <immintrin.h>

#include "backend/cpu/x86/panel_avx512.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/check.h"

namespace pagoda::cpu {
namespace {

// Column pairs per slice (even): 4 panels' slice is 32 KiB. Each slice reloads and stores every
// output of the thread's share, lines of y that have left the cache by then: 64 pairs (8 KiB)
// left f16 prefill 512 1.06 to 1.3x slower (Zen 5, 2026-12-05); 512 measured the same as 256.
constexpr int64_t kSlicePairs = 256;
constexpr int kGroupPanels = 4;      // panels per group: two 512-bit vectors per pair
constexpr int64_t kPairColumn = kGroupPanels * kPanelRows;  // dwords per column pair of the buffer
constexpr int kRows = 12;            // input rows per tile: 12 x 2 accumulators, 2 weights
// Up to kDirectMaxRows input rows (decode, a speculative step's verification, small batches), no
// buffer: the weights straight to the dot, each group of panels through all of k, for tiles of
// up to kDirectRows rows one after the other (a group's panels are read from memory once, then
// from the cache). More rows: the buffered k slices. (The buffered path walks every panel of the
// thread's share slice by slice, no stream the prefetchers follow: a 5-row verification took
// 1.7x a 4-row one, 2026-12-05.)
constexpr int kDirectRows = 8;
constexpr int64_t kDirectMaxRows = 16;
// The direct path streams its panels from memory: it asks for each panel's line this many bytes
// ahead of what it reads (as the AVX2 decode loops do).
constexpr int64_t kPrefetchAhead = 768;

// Four columns of a panel's 8 rows (32 bf16 values, column-major as packed), columns from
// `mask` off read as zeros (and not read).
PAGODA_INLINE __m512i load4(const uint8_t* col, __mmask32 mask) { return _mm512_maskz_loadu_epi16(mask, col); }

// Word indices of vpermt2w that pair columns (c, c + 1) of each row: dword i < 8 takes row i of
// the first vector's columns, dword 8 + i row i of the second's (word 32 on).
PAGODA_INLINE __m512i pair_index(int c) {
  alignas(64) int16_t idx[32];
  for (int i = 0; i < 8; ++i) {
    idx[2 * i] = static_cast<int16_t>(8 * c + i);
    idx[2 * i + 1] = static_cast<int16_t>(8 * c + 8 + i);
    idx[16 + 2 * i] = static_cast<int16_t>(32 + 8 * c + i);
    idx[16 + 2 * i + 1] = static_cast<int16_t>(32 + 8 * c + 8 + i);
  }
  return _mm512_load_si512(idx);
}

// Columns [t, t + 4) of panels a (dwords 0..7) and b (dwords 8..15), t even, as each row's bf16
// pairs: w[0] columns (t, t + 1), w[1] (t + 2, t + 3), the earlier column in the low half;
// columns from k on are zeros.
PAGODA_INLINE void two_pairs(const uint8_t* a, const uint8_t* b, int64_t t, int64_t k, __m512i idx0, __m512i idx1,
                             __m512i w[2]) {
  constexpr int64_t kColumnBytes = kPanelRows * 2;
  const int64_t words = (k - t) * kPanelRows;
  const __mmask32 mask = words >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << words) - 1);
  const __m512i va = load4(a + t * kColumnBytes, mask), vb = load4(b + t * kColumnBytes, mask);
  w[0] = _mm512_permutex2var_epi16(va, idx0, vb);
  w[1] = _mm512_permutex2var_epi16(va, idx1, vb);
}

// The panels of a group of up to four as the two vectors' halves: p, p + 1, p + 2, p + 3 of p1
// (group_at), where a missing panel repeats its neighbour (its outputs are computed and not
// stored), or four runs' panels in decode (group_of_runs).
struct Group {
  const uint8_t* panel[kGroupPanels];
  int64_t col[kGroupPanels];  // the output column of each panel's first row
  __mmask16 mask[2];          // the lanes of each vector whose outputs exist
  int vectors;                // 1 or 2
};

PAGODA_INLINE Group group_at(const uint8_t* panels, int64_t panel_bytes, int64_t p, int64_t p1, int64_t n) {
  Group g;
  const int64_t num = min64(p1 - p, kGroupPanels);
  for (int q = 0; q < kGroupPanels; ++q) {
    const int64_t src = q < num ? q : (q % 2 == 1 && q - 1 < num ? q - 1 : 0);
    g.panel[q] = panels + (p + src) * panel_bytes;
    g.col[q] = (p + q) * kPanelRows;
  }
  const int64_t valid = min64(n - p * kPanelRows, num * kPanelRows);
  g.mask[0] = first_lanes(valid);
  g.mask[1] = first_lanes(valid - 16);
  g.vectors = num <= 2 ? 1 : 2;
  return g;
}

// The panels p, p + run, p + 2 run and p + 3 run (decode_runs in panel_avx2.h).
PAGODA_INLINE Group group_of_runs(const uint8_t* panels, int64_t panel_bytes, int64_t p, int64_t run, int64_t n) {
  Group g;
  for (int q = 0; q < kGroupPanels; ++q) {
    g.panel[q] = panels + (p + q * run) * panel_bytes;
    g.col[q] = (p + q * run) * kPanelRows;
  }
  for (int v = 0; v < 2; ++v) g.mask[v] = halves_mask(g.col[2 * v], g.col[2 * v + 1], n);
  g.vectors = 2;
  return g;
}

// buf[u * kPairColumn + 16 v + c]: vector v's dword c for pair u0 + u, u < pairs (u0 even).
PAGODA_INLINE void interleave_slice(const Group& g, int64_t k, int64_t u0, int64_t pairs, uint32_t* buf) {
  const __m512i idx0 = pair_index(0), idx1 = pair_index(2);
  for (int v = 0; v < g.vectors; ++v) {
    for (int64_t u = 0; u < pairs; u += 2) {
      __m512i w[2];
      two_pairs(g.panel[2 * v], g.panel[2 * v + 1], 2 * (u0 + u), k, idx0, idx1, w);
      _mm512_store_si512(buf + u * kPairColumn + 16 * v, w[0]);
      if (u + 1 < pairs) _mm512_store_si512(buf + (u + 1) * kPairColumn + 16 * v, w[1]);
    }
  }
}

// acc[r][j] = dot(acc, row r's pair at xb + r * ldx + 2 u, w[j]), the pair broadcast.
template <int R, int J>
PAGODA_INLINE void dot_pair(__m512 (&acc)[R][J], const uint16_t* xb, int64_t ldx, int64_t u, const __m512i* w) {
  unroll<R>([&](auto r) PAGODA_LAMBDA {
    const __m512i xv = _mm512_set1_epi32(load_i32(xb + r.value * ldx + 2 * u));
    unroll<J>([&](auto j) PAGODA_LAMBDA {
      acc[r.value][j.value] = _mm512_dpbf16_ps(acc[r.value][j.value], (__m512bh)xv, (__m512bh)w[j.value]);
    });
  });
}

// y[r, 16 j + lane] (+)= the pairs [u0, u0 + pairs) of R input rows (bf16, row r at xb + r * ldx)
// against J vectors of the buffer, lanes of mask[j] only. accumulate: continue the running sums
// already in y.
template <int R, int J>
PAGODA_INLINE void tile(const uint16_t* xb, int64_t ldx, int64_t u0, const uint32_t* buf, int64_t pairs,
                        bool accumulate, float* y, int64_t ldy, const __mmask16* mask) {
  __m512 acc[R][J];
  load_tile_sums<R, J>(acc, accumulate, y, ldy, mask);
  for (int64_t u = 0; u < pairs; ++u) {
    __m512i w[J];
    unroll<J>([&](auto j) PAGODA_LAMBDA { w[j.value] = _mm512_load_si512(buf + u * kPairColumn + 16 * j.value); });
    dot_pair<R, J>(acc, xb, ldx, u0 + u, w);
  }
  store_tile_sums<R, J>(acc, y, ldy, mask);
}

template <int J>
PAGODA_INLINE void slice_all_rows(const uint16_t* xb, int64_t ldx, int64_t m, int64_t u0, const uint32_t* buf,
                                  int64_t pairs, bool accumulate, float* y, int64_t ldy, const __mmask16* mask) {
  for (int64_t i = 0; i < m; i += kRows) {
    with_rows<kRows>(m - i, [&](auto r) PAGODA_LAMBDA {
      tile<r.value, J>(xb + i * ldx, ldx, u0, buf, pairs, accumulate, y + i * ldy, ldy, mask);
    });
  }
}

// Many rows: each k slice of a group interleaved once into a buffer, then every row's tiles on it.
PAGODA_FLATTEN void buffered_rows(const uint16_t* xb, int64_t ldx, int64_t m, int64_t k, const uint8_t* panels,
                                  int64_t n, float* y, int64_t ldy, int64_t p0, int64_t p1) {
  const int64_t panel_bytes = k * kPanelRows * 2;
  const int64_t num_pairs = (k + 1) / 2;
  alignas(64) uint32_t buf[kSlicePairs * kPairColumn];  // 32 KiB
  for (int64_t u0 = 0; u0 < num_pairs; u0 += kSlicePairs) {
    const int64_t pairs = min64(kSlicePairs, num_pairs - u0);
    const bool accumulate = u0 > 0;
    for (int64_t p = p0; p < p1; p += kGroupPanels) {
      const Group g = group_at(panels, panel_bytes, p, p1, n);
      interleave_slice(g, k, u0, pairs, buf);
      float* yp = y + p * kPanelRows;
      if (g.vectors == 1) {
        slice_all_rows<1>(xb, ldx, m, u0, buf, pairs, accumulate, yp, ldy, g.mask);
      } else {
        slice_all_rows<2>(xb, ldx, m, u0, buf, pairs, accumulate, yp, ldy, g.mask);
      }
    }
  }
}

// R rows (decode and small batches) against a group, the weights interleaved in registers as the
// pairs stream by: the same operations on each output as the buffered path. y: the rows' first
// outputs (the group's columns are g.col).
template <int R, int J>
PAGODA_INLINE void direct_tile(const uint16_t* xb, int64_t ldx, int64_t k, const Group& g, float* y, int64_t ldy) {
  const __m512i idx0 = pair_index(0), idx1 = pair_index(2);
  const int64_t num_pairs = (k + 1) / 2;
  __m512 acc[R][J];
  unroll<R>([&](auto r) PAGODA_LAMBDA { unroll<J>([&](auto j) PAGODA_LAMBDA { acc[r.value][j.value] = _mm512_setzero_ps(); }); });
  for (int64_t u = 0; u < num_pairs; u += 2) {
    __m512i w[2][J];
    unroll<J>([&](auto j) PAGODA_LAMBDA {
      for (int q = 0; q < 2; ++q) {
        _mm_prefetch(reinterpret_cast<const char*>(g.panel[2 * j.value + q] + 2 * u * 2 * kPanelRows + kPrefetchAhead),
                     _MM_HINT_T0);
      }
      __m512i both[2];
      two_pairs(g.panel[2 * j.value], g.panel[2 * j.value + 1], 2 * u, k, idx0, idx1, both);
      w[0][j.value] = both[0];
      w[1][j.value] = both[1];
    });
    dot_pair<R, J>(acc, xb, ldx, u, w[0]);
    if (u + 1 < num_pairs) dot_pair<R, J>(acc, xb, ldx, u + 1, w[1]);
  }
  unroll<J>([&](auto j) PAGODA_LAMBDA {
    unroll<R>([&](auto r) PAGODA_LAMBDA {
      store_halves(y + r.value * ldy, g.col[2 * j.value], g.col[2 * j.value + 1], g.mask[j.value], acc[r.value][j.value]);
    });
  });
}

PAGODA_FLATTEN void direct_rows(const uint16_t* xb, int64_t ldx, int64_t m, int64_t k, const uint8_t* panels,
                                int64_t n, float* y, int64_t ldy, int64_t p0, int64_t p1) {
  const int64_t panel_bytes = k * kPanelRows * 2;
  auto tile = [&](const Group& g) PAGODA_LAMBDA {
    for (int64_t i = 0; i < m; i += kDirectRows) {
      with_rows<kDirectRows>(m - i, [&](auto r) PAGODA_LAMBDA {
        if (g.vectors == 1) {
          direct_tile<r.value, 1>(xb + i * ldx, ldx, k, g, y + i * ldy, ldy);
        } else {
          direct_tile<r.value, 2>(xb + i * ldx, ldx, k, g, y + i * ldy, ldy);
        }
      });
    }
  };
  // The weights stream from memory (decode): four runs of panels side by side, then the rest.
  int64_t p = decode_runs<kGroupPanels>(p0, p1, [&](int64_t q, int64_t run) PAGODA_LAMBDA {
    tile(group_of_runs(panels, panel_bytes, q, run, n));
  });
  for (; p < p1; p += kGroupPanels) tile(group_at(panels, panel_bytes, p, p1, n));
}

void bf16_rows(const uint16_t* xb, int64_t ldx, int64_t m, int64_t k, const uint8_t* panels, int64_t n, float* y,
               int64_t ldy, int64_t p0, int64_t p1) {
  if (m <= kDirectMaxRows) {
    direct_rows(xb, ldx, m, k, panels, n, y, ldy, p0, p1);
  } else {
    buffered_rows(xb, ldx, m, k, panels, n, y, ldy, p0, p1);
  }
}

}  // namespace

void convert_rows_bf16_avx512bf16(const float* x, int64_t m, int64_t k, int64_t ld, uint16_t* out) {
  PAGODA_CHECK(ld >= (k + 15) / 16 * 16);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < k; t += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(first_lanes(k - t), x + i * k + t);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * ld + t), (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

void convert_f16_to_bf16_avx512bf16(uint16_t* words, int64_t count) {
  for (int64_t i = 0; i < count; i += 32) {
    const __mmask32 mask = count - i >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << (count - i)) - 1);
    const __m512i h = _mm512_maskz_loadu_epi16(mask, words + i);
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
    const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1));
    _mm512_mask_storeu_epi16(words + i, mask, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));  // lo's in the low half
  }
}

void matmul_bf16_rows_avx512bf16(const uint16_t* xb, int64_t ldx, int64_t m, int64_t k, DType type,
                                 const void* panels, int64_t n, float* y, int64_t ldy, int64_t panel_begin,
                                 int64_t panel_end) {
  const auto* w = static_cast<const uint8_t*>(panels);
  PAGODA_CHECK((type == DType::kF16 || type == DType::kBF16) &&
               "matmul_bf16_rows_avx512bf16 takes pack_matmul_weight_avx512bf16's f16 or bf16 panels");
  bf16_rows(xb, ldx, m, k, w, n, y, ldy, panel_begin, panel_end);
}

}  // namespace pagoda::cpu
