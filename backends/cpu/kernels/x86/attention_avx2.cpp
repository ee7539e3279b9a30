// The AVX2 + FMA paged-attention leaf: one sequence, one kv head, a tile of query rows and the
// query heads that read that kv head (GQA). Built with -mavx2 -mfma; read x86_kernels.h before
// adding an #include.
//
// Keys are visited in tiles of kKeyTile positions aligned to absolute positions, each tile's K and
// V rows (a few KiB) staying in L1 while every query vector of the tile passes over them, so GQA
// heads and neighbouring query rows share one read of the cache. Softmax is online (flash
// attention): each query vector keeps its running maximum and denominator, and its output row
// accumulates the unnormalised weighted values, rescaled when the maximum grows. Scores come 8
// keys at a time (one accumulator per key, summed across lanes together), and the weighted
// values 64 output elements at a time (8 independent FMA chains), so neither waits on a
// horizontal sum or one long dependency chain.
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

#define PAGODA_ATT_INLINE inline __attribute__((always_inline))

// kp[t - t0] and vp[t - t0]: the cached K and V rows of positions t in [first, last], all in the
// tile starting at t0 (one division a tile, not one a key).
PAGODA_ATT_INLINE void tile_rows(const AttentionTile& a, int64_t t0, int64_t first, int64_t last,
                                 const float** kp, const float** vp) {
  int64_t block = first / a.block_size, offset = first % a.block_size;
  for (int64_t t = first; t <= last; ++t) {
    const int64_t slot = static_cast<int64_t>(a.block_table[block]) * a.block_size + offset;
    kp[t - t0] = a.key + slot * a.kv_slot_stride;
    vp[t - t0] = a.value + slot * a.kv_slot_stride;
    if (++offset == a.block_size) {
      ++block;
      offset = 0;
    }
  }
}

// Lane j = the sum of the 8 lanes of a[j].
PAGODA_ATT_INLINE __m256 sum_lanes8(const __m256 (&a)[8]) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  // u0 = [a0 a1 a2 a3 (low 4 lanes summed) | a0 a1 a2 a3 (high 4)], u1 likewise for a4..a7.
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// Lane j = q . k[j] over head_dim elements, for 8 keys: one accumulator per key, 8 lanes of the
// head dimension each, summed across lanes at the end (the head_dim % 8 tail added in scalar).
// Each lane's value depends only on q and its own key.
PAGODA_ATT_INLINE __m256 dot8(const float* q, const float* const* k, int64_t head_dim) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  int64_t d = 0;
  for (; d + 8 <= head_dim; d += 8) {
    const __m256 qv = _mm256_loadu_ps(q + d);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k[j] + d), acc[j]);
  }
  __m256 s = sum_lanes8(acc);
  if (d < head_dim) {
    alignas(32) float tail[8];
    for (int j = 0; j < 8; ++j) {
      float t = 0;
      for (int64_t e = d; e < head_dim; ++e) t += q[e] * k[j][e];
      tail[j] = t;
    }
    s = _mm256_add_ps(s, _mm256_load_ps(tail));
  }
  return s;
}

// out = out * scale_old, then out += sum over t < count of p[t] * v[t]. Up to 64 elements of out
// at a time, as 8 independent FMA chains over the keys.
PAGODA_ATT_INLINE void rescale_accumulate(float* out, float scale_old, const float* p,
                                          const float* const* v, int64_t count, int64_t head_dim) {
  const __m256 s = _mm256_set1_ps(scale_old);
  int64_t d = 0;
  for (; d + 64 <= head_dim; d += 64) {
    __m256 acc[8];
    for (int c = 0; c < 8; ++c) acc[c] = _mm256_mul_ps(_mm256_loadu_ps(out + d + 8 * c), s);
    for (int64_t t = 0; t < count; ++t) {
      const __m256 pt = _mm256_broadcast_ss(p + t);
      for (int c = 0; c < 8; ++c) acc[c] = _mm256_fmadd_ps(pt, _mm256_loadu_ps(v[t] + d + 8 * c), acc[c]);
    }
    for (int c = 0; c < 8; ++c) _mm256_storeu_ps(out + d + 8 * c, acc[c]);
  }
  for (; d + 8 <= head_dim; d += 8) {
    __m256 acc = _mm256_mul_ps(_mm256_loadu_ps(out + d), s);
    for (int64_t t = 0; t < count; ++t)
      acc = _mm256_fmadd_ps(_mm256_broadcast_ss(p + t), _mm256_loadu_ps(v[t] + d), acc);
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
    const int64_t first = t0 < lowest ? lowest : t0;
    tile_rows(a, t0, first, t_end, kp, vp);
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
        // Scores of the tile's keys, 8 per vector; lanes past count are -inf (weight 0).
        __m256 sv[kKeyTile / 8];
        __m256 tile_max_v = _mm256_set1_ps(-__builtin_inff());
        for (int64_t j = 0; j < kKeyTile / 8; ++j) {
          if (8 * j >= count) {
            sv[j] = _mm256_set1_ps(-__builtin_inff());
            continue;
          }
          const float* keys[8];
          for (int64_t e = 0; e < 8; ++e) keys[e] = kp[lo - t0 + (8 * j + e < count ? 8 * j + e : 0)];
          const __m256 valid = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7),
                                             _mm256_set1_ps(static_cast<float>(count - 8 * j)), _CMP_LT_OQ);
          sv[j] = _mm256_blendv_ps(_mm256_set1_ps(-__builtin_inff()),
                                   _mm256_mul_ps(dot8(qv, keys, hd), _mm256_set1_ps(a.scale)), valid);
          tile_max_v = _mm256_max_ps(tile_max_v, sv[j]);
        }
        const float tile_max = avx2::hmax(tile_max_v);
        const float new_max = tile_max > max_score[vi] ? tile_max : max_score[vi];
        // First tile: the zero output and denominator need no rescale (and e^(-inf) is avoided).
        const float scale_old = max_score[vi] == -__builtin_inff() ? 0.0f : __builtin_expf(max_score[vi] - new_max);
        max_score[vi] = new_max;
        const __m256 m = _mm256_set1_ps(new_max);
        __m256 sum_v = _mm256_setzero_ps();
        for (int64_t j = 0; j < kKeyTile / 8; ++j) {
          // exp clamps -inf to a tiny value: the mask makes missing keys' weights exactly 0.
          const __m256 valid = _mm256_cmp_ps(sv[j], _mm256_set1_ps(-__builtin_inff()), _CMP_NEQ_OQ);
          const __m256 p = _mm256_and_ps(avx2::exp(_mm256_sub_ps(sv[j], m)), valid);
          _mm256_store_ps(score + 8 * j, p);
          sum_v = _mm256_add_ps(sum_v, p);
        }
        const float tile_sum = avx2::hsum(sum_v);
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


// ---- Query vectors across the lanes (GQA groups of 4 or more) ----
//
// attention_tile_lanes_avx2 puts 8 query vectors (rows x heads of the tile, in that order) in the
// 8 lanes of a vector and walks the head dimension with the cache's elements broadcast: a score is
// one FMA chain in d order within its own lane, and the running maximum, the denominator, the
// weights and the output rows are lane-wise too. So nothing is summed across lanes, the softmax
// needs no scalar step, and all query vectors of a kv head share each K/V load. A lane's result
// depends only on its own query, position and the cache: keys outside its own range get weight 0,
// and a tile with none of its keys leaves its state unchanged (rescale by exactly 1, weights 0), so
// it does not matter which other vectors share its lanes, or which tiles those make it visit.
// (That holds while the cache holds finite values; an inf among the K/V rows of a tile that is
// masked for a lane would reach it as 0 * inf.)
namespace {

// Scores of 8 keys for the 8 lanes of one group: acc[j] = sum over d of qt[d] * k[j][d].
PAGODA_ATT_INLINE void scores8(const float* qt, const float* const* k, int64_t head_dim,
                               float* scores) {
  __m256 acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  for (int64_t d = 0; d < head_dim; ++d) {
    const __m256 qd = _mm256_loadu_ps(qt + 8 * d);
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(qd, _mm256_broadcast_ss(k[j] + d), acc[j]);
  }
  for (int j = 0; j < 8; ++j) _mm256_store_ps(scores + 8 * j, acc[j]);
}

// ot[d + e] = ot[d + e] * scale + sum over keys j in [j_begin, j_end] of p[j] * v[j][d + e], for
// e < C: C independent FMA chains (one per output element, 8 lanes each).
template <int C>
PAGODA_ATT_INLINE void weigh_values(float* ot, __m256 scale, const float* p, const float* const* v,
                                    int64_t j_begin, int64_t j_end, int64_t d) {
  __m256 acc[C];
  for (int e = 0; e < C; ++e) acc[e] = _mm256_mul_ps(_mm256_loadu_ps(ot + 8 * (d + e)), scale);
  for (int64_t j = j_begin; j <= j_end; ++j) {
    const __m256 pj = _mm256_load_ps(p + 8 * j);
    for (int e = 0; e < C; ++e) acc[e] = _mm256_fmadd_ps(pj, _mm256_broadcast_ss(v[j] + d + e), acc[e]);
  }
  for (int e = 0; e < C; ++e) _mm256_storeu_ps(ot + 8 * (d + e), acc[e]);
}

}  // namespace

void attention_tile_lanes_avx2(const AttentionTile& a) {
  const int64_t hd = a.head_dim;
  const int64_t num_vecs = a.num_rows * a.num_group_heads;
  const int64_t groups = (num_vecs + 7) / 8;
  float* qt = a.scratch;                 // [groups][hd][8]: the queries, times the scale
  float* ot = qt + groups * hd * 8;      // [groups][hd][8]: the unnormalised outputs
  float* mx = ot + groups * hd * 8;      // [groups][8]: running maximum
  float* den = mx + groups * 8;          // [groups][8]: running denominator
  alignas(32) int32_t lane_lo[kMaxLaneGroups * 8];  // a lane's keys: [lo, hi] (none if lo > hi)
  alignas(32) int32_t lane_hi[kMaxLaneGroups * 8];
  for (int64_t v = 0; v < groups * 8; ++v) {
    const int64_t grp = v / 8, lane = v % 8;
    float* q_lane = qt + grp * hd * 8 + lane;
    if (v < num_vecs) {
      const int64_t r = v / a.num_group_heads, g = v % a.num_group_heads;
      const int64_t pos = a.first_pos + r;
      lane_hi[v] = static_cast<int32_t>(pos);
      lane_lo[v] = static_cast<int32_t>(a.sliding_window > 0 ? pos - a.sliding_window + 1 : 0);
      const float* q = a.q + r * a.row_stride + g * hd;
      for (int64_t d = 0; d < hd; ++d) q_lane[8 * d] = q[d] * a.scale;
    } else {  // padding: no keys
      lane_hi[v] = -1;
      lane_lo[v] = 0;
      for (int64_t d = 0; d < hd; ++d) q_lane[8 * d] = 0;
    }
    mx[v] = -__builtin_inff();
    den[v] = 0;
  }
  for (int64_t i = 0; i < groups * hd * 8; ++i) ot[i] = 0;

  const int64_t last_pos = a.first_pos + a.num_rows - 1;
  int64_t lowest = 0;
  if (a.sliding_window > 0 && a.first_pos - a.sliding_window + 1 > 0) {
    lowest = a.first_pos - a.sliding_window + 1;
  }

  const float* kp[kKeyTile];
  const float* vp[kKeyTile];
  alignas(32) float tile[kKeyTile * 8];  // per key: its 8 lanes' score, then weight
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  for (int64_t t0 = lowest - lowest % kKeyTile; t0 <= last_pos; t0 += kKeyTile) {
    // Keys [first, last] of this tile are in range for some lane; the others point at `first`'s
    // row (read, then masked) so that every pointer is valid.
    const int64_t first = t0 < lowest ? lowest : t0;
    const int64_t last = t0 + kKeyTile - 1 < last_pos ? t0 + kKeyTile - 1 : last_pos;
    tile_rows(a, t0, first, last, kp, vp);
    for (int64_t t = t0; t < first; ++t) {
      kp[t - t0] = kp[first - t0];
      vp[t - t0] = vp[first - t0];
    }
    for (int64_t t = last + 1; t < t0 + kKeyTile; ++t) {
      kp[t - t0] = kp[first - t0];
      vp[t - t0] = vp[first - t0];
    }
    const int64_t j_begin = first - t0, j_end = last - t0;
    for (int64_t grp = 0; grp < groups; ++grp) {
      const float* q = qt + grp * hd * 8;
      for (int64_t half = 0; half < kKeyTile / 8; ++half)
        if (8 * half <= j_end && 8 * half + 7 >= j_begin) scores8(q, kp + 8 * half, hd, tile + 64 * half);
      // Mask the keys outside each lane's range; the tile's maximum per lane.
      const __m256i lo = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_lo + 8 * grp));
      const __m256i hi = _mm256_load_si256(reinterpret_cast<const __m256i*>(lane_hi + 8 * grp));
      __m256 tile_max = neg_inf;
      for (int64_t j = j_begin; j <= j_end; ++j) {
        const __m256i t = _mm256_set1_epi32(static_cast<int32_t>(t0 + j));
        const __m256 outside = _mm256_castsi256_ps(
            _mm256_or_si256(_mm256_cmpgt_epi32(t, hi), _mm256_cmpgt_epi32(lo, t)));
        const __m256 s = _mm256_blendv_ps(_mm256_load_ps(tile + 8 * j), neg_inf, outside);
        _mm256_store_ps(tile + 8 * j, s);
        tile_max = _mm256_max_ps(tile_max, s);
      }
      const __m256 old_max = _mm256_loadu_ps(mx + 8 * grp);
      const __m256 new_max = _mm256_max_ps(old_max, tile_max);
      // Unchanged maximum (including a tile with none of the lane's keys): exactly 1.
      const __m256 scale_old = _mm256_blendv_ps(avx2::exp(_mm256_sub_ps(old_max, new_max)),
                                                _mm256_set1_ps(1.0f),
                                                _mm256_cmp_ps(old_max, new_max, _CMP_EQ_OQ));
      __m256 sum = _mm256_setzero_ps();
      for (int64_t j = j_begin; j <= j_end; ++j) {
        const __m256 s = _mm256_load_ps(tile + 8 * j);
        // Masked keys weigh exactly 0 (exp alone would give a tiny value, or NaN from -inf - -inf).
        const __m256 p = _mm256_and_ps(avx2::exp(_mm256_sub_ps(s, new_max)),
                                       _mm256_cmp_ps(s, neg_inf, _CMP_NEQ_OQ));
        _mm256_store_ps(tile + 8 * j, p);
        sum = _mm256_add_ps(sum, p);
      }
      _mm256_storeu_ps(mx + 8 * grp, new_max);
      _mm256_storeu_ps(den + 8 * grp, _mm256_fmadd_ps(_mm256_loadu_ps(den + 8 * grp), scale_old, sum));
      float* o = ot + grp * hd * 8;
      int64_t d = 0;
      for (; d + 8 <= hd; d += 8) weigh_values<8>(o, scale_old, tile, vp, j_begin, j_end, d);
      for (; d < hd; ++d) weigh_values<1>(o, scale_old, tile, vp, j_begin, j_end, d);
    }
  }
  for (int64_t v = 0; v < num_vecs; ++v) {
    const int64_t grp = v / 8, lane = v % 8;
    const int64_t r = v / a.num_group_heads, g = v % a.num_group_heads;
    const float inv = den[v] > 0 ? 1.0f / den[v] : 0.0f;
    const float* o_lane = ot + grp * hd * 8 + lane;
    float* out = a.out + r * a.row_stride + g * hd;
    for (int64_t d = 0; d < hd; ++d) out[d] = o_lane[8 * d] * inv;
  }
}

}  // namespace pagoda::cpu
