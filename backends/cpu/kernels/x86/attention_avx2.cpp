// The AVX2 + FMA paged-attention leaf: one sequence, one kv head, a tile of query rows and the
// query heads that read that kv head (GQA). Built with -mavx2 -mfma; read x86_kernels.h before
// adding an #include.
//
// Keys are visited in tiles of kKeyTile positions aligned to absolute positions, each tile's K and
// V rows (a few KiB) staying in L1 while every query vector of the tile passes over them, so GQA
// heads and neighbouring query rows share one read of the cache. Softmax is online (flash
// attention): each query vector keeps its running maximum and denominator, and its output row
// accumulates the unnormalised weighted values, rescaled when the maximum grows.
//
// Determinism: a query vector's result depends only on its own values, its position and the
// cache, never on the other rows or heads of the tile, the tile size or the thread count: its keys
// are visited in the same absolute-position tiles, in the same order, whoever else is computed
// alongside. So the same sequence gives the same bits in any batch and with or without chunked
// prefill.
#include <immintrin.h>

#include <cstdint>

#include "backends/cpu/kernels/x86/math_avx2.h"
#include "backends/cpu/kernels/x86/x86_kernels.h"

namespace pagoda::cpu {
namespace {

constexpr int64_t kKeyTile = 16;  // key positions per tile (also the most scores kept at once)

// q . k over head_dim elements (any head_dim; 8 lanes at a time, then the tail in scalar).
inline __attribute__((always_inline)) float dot(const float* q, const float* k, int64_t head_dim) {
  __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 16 <= head_dim; d += 16) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
    a1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), a1);
  }
  if (d + 8 <= head_dim) {
    a0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a0);
    d += 8;
  }
  float s = avx2::hsum(_mm256_add_ps(a0, a1));
  for (; d < head_dim; ++d) s += q[d] * k[d];
  return s;
}

// out = out * scale (scale_old) then out += sum over the tile of p[t] * v[t].
inline __attribute__((always_inline)) void rescale_accumulate(float* out, float scale_old,
                                                              const float* p, const float* const* v,
                                                              int64_t count, int64_t head_dim) {
  int64_t d = 0;
  const __m256 s = _mm256_set1_ps(scale_old);
  for (; d + 8 <= head_dim; d += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(out + d), s);
    for (int64_t t = 0; t < count; ++t)
      acc = _mm256_fmadd_ps(_mm256_set1_ps(p[t]), _mm256_loadu_ps(v[t] + d), acc);
    _mm256_storeu_ps(out + d, acc);
  }
  for (; d < head_dim; ++d) {
    float acc = out[d] * scale_old;
    for (int64_t t = 0; t < count; ++t) acc += p[t] * v[t][d];
    out[d] = acc;
  }
}

}  // namespace

void attention_tile_avx2(const AttentionTile& a) {
  const int64_t hd = a.head_dim;
  const int64_t num_vecs = a.num_rows * a.num_group_heads;
  float* max_score = a.scratch;             // [num_vecs]
  float* denom = a.scratch + num_vecs;      // [num_vecs]
  for (int64_t i = 0; i < num_vecs; ++i) {
    max_score[i] = -__builtin_inff();
    denom[i] = 0;
  }
  for (int64_t r = 0; r < a.num_rows; ++r)
    for (int64_t g = 0; g < a.num_group_heads; ++g) {
      float* o = a.out + r * a.row_stride + g * hd;
      for (int64_t d = 0; d < hd; ++d) o[d] = 0;
    }

  // Keys any row of the tile reads: [first of row 0, position of the last row].
  const int64_t last_pos = a.first_pos + a.num_rows - 1;
  int64_t lowest = 0;
  if (a.sliding_window > 0) lowest = a.first_pos - a.sliding_window + 1 > 0 ? a.first_pos - a.sliding_window + 1 : 0;

  const float* kp[kKeyTile];
  const float* vp[kKeyTile];
  alignas(32) float score[kKeyTile];
  for (int64_t t0 = lowest - lowest % kKeyTile; t0 <= last_pos; t0 += kKeyTile) {
    const int64_t t_end = t0 + kKeyTile - 1 < last_pos ? t0 + kKeyTile - 1 : last_pos;  // inclusive
    for (int64_t t = t0 < lowest ? lowest : t0; t <= t_end; ++t) {
      const int64_t slot = static_cast<int64_t>(a.block_table[t / a.block_size]) * a.block_size +
                           t % a.block_size;
      kp[t - t0] = a.key + slot * a.kv_slot_stride;
      vp[t - t0] = a.value + slot * a.kv_slot_stride;
    }
    for (int64_t r = 0; r < a.num_rows; ++r) {
      const int64_t pos = a.first_pos + r;
      int64_t lo = t0;
      if (a.sliding_window > 0 && pos - a.sliding_window + 1 > lo) lo = pos - a.sliding_window + 1;
      const int64_t hi = pos < t_end ? pos : t_end;
      if (lo > hi) continue;
      const int64_t count = hi - lo + 1;
      for (int64_t g = 0; g < a.num_group_heads; ++g) {
        const int64_t vi = r * a.num_group_heads + g;
        const float* qv = a.q + r * a.row_stride + g * hd;
        float tile_max = -__builtin_inff();
        for (int64_t t = 0; t < count; ++t) {
          score[t] = dot(qv, kp[lo - t0 + t], hd) * a.scale;
          tile_max = score[t] > tile_max ? score[t] : tile_max;
        }
        const float new_max = tile_max > max_score[vi] ? tile_max : max_score[vi];
        // First tile: the zero output and denominator need no rescale (and e^(-inf) is avoided).
        const float scale_old = max_score[vi] == -__builtin_inff() ? 0.0f : __builtin_expf(max_score[vi] - new_max);
        max_score[vi] = new_max;
        float tile_sum = 0;
        int64_t t = 0;
        const __m256 m = _mm256_set1_ps(new_max);
        for (; t + 8 <= count; t += 8) {
          const __m256 p = avx2::exp(_mm256_sub_ps(_mm256_loadu_ps(score + t), m));
          _mm256_storeu_ps(score + t, p);
          tile_sum += avx2::hsum(p);
        }
        for (; t < count; ++t) {
          score[t] = __builtin_expf(score[t] - new_max);
          tile_sum += score[t];
        }
        denom[vi] = denom[vi] * scale_old + tile_sum;
        rescale_accumulate(a.out + r * a.row_stride + g * hd, scale_old, score, vp + (lo - t0),
                           count, hd);
      }
    }
  }
  for (int64_t r = 0; r < a.num_rows; ++r)
    for (int64_t g = 0; g < a.num_group_heads; ++g) {
      const int64_t vi = r * a.num_group_heads + g;
      float* o = a.out + r * a.row_stride + g * hd;
      const float inv = denom[vi] > 0 ? 1.0f / denom[vi] : 0.0f;
      for (int64_t d = 0; d < hd; ++d) o[d] *= inv;
    }
}

}  // namespace pagoda::cpu
