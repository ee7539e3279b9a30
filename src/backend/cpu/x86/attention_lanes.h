// The paged-attention kernel with query vectors across the lanes, for any vector width: the body
// of attention_tile_lanes_avx2 (8 lanes, attention_avx2.cpp) and attention_tile_lanes_avx512 (16
// lanes, attention_avx512.cpp). Include only from those files: V's operations are their ISA's
// code, with internal linkage here (see x86_kernels.h for why a baseline file must never see one).
//
// L = V::kLanes query vectors (rows x heads of the tile, in that order) sit in the lanes of a
// vector, and the head dimension is walked with the cache's elements broadcast: a score is one FMA
// chain in d order within its own lane, and the running maximum, the denominator, the weights and
// the output rows are lane-wise too. So nothing is summed across lanes, the softmax needs no scalar
// step, and all query vectors of a kv head share each K/V load. A lane's result depends only on its
// own query, position and the cache: keys outside its own range get weight 0, and a tile with none
// of its keys leaves its state unchanged (rescale by exactly 1, weights 0), so it does not matter
// which other vectors share its lanes, or which tiles those make it visit. The same holds across
// widths: each lane runs the same operations in the same order at 8 or 16 lanes (V::exp is one
// polynomial), so the two kernels give the same bits. (That holds while the cache holds finite
// values; an inf among the K/V rows of a tile that is masked for a lane would reach it as 0 * inf.)
//
// V provides: kLanes; vec; zero(), set1(f), load(p) (unaligned), store(p, v), broadcast(p),
// fmadd(a, b, c) = a * b + c, mul, add, sub, max; exp(v) (math_avx2.h's polynomial);
// outside_to_neg_inf(s, lo, hi, t): s, with -inf in the lanes whose key range [lo, hi] misses t;
// one_where_equal(a, b, v): 1 where a == b, else v; zero_where_neg_inf(s, p): p, with 0 where s
// is -inf.
#pragma once

#include <cstdint>

#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {
namespace {  // internal linkage: each leaf file has its own copy, built with its own flags

#define PAGODA_LANES_INLINE inline __attribute__((always_inline))

constexpr int64_t kKeyTile = kAttentionKeyTile;  // (also the most scores kept at once)
// The most query vectors of one tile (x86_kernels.h).
constexpr int64_t kMaxLaneVectors = 8 * kMaxLaneGroups;

// Scores of 8 keys for the L lanes of one group: scores[L j + lane] = sum over d of qt[L d +
// lane] * k[j][d].
template <class V>
PAGODA_LANES_INLINE void lane_scores8(const float* qt, const float* const* k, int64_t head_dim, float* scores) {
  constexpr int64_t L = V::kLanes;
  typename V::vec acc[8];
  for (int j = 0; j < 8; ++j) acc[j] = V::zero();
  for (int64_t d = 0; d < head_dim; ++d) {
    const typename V::vec qd = V::load(qt + L * d);
    for (int j = 0; j < 8; ++j) acc[j] = V::fmadd(qd, V::broadcast(k[j] + d), acc[j]);
  }
  for (int j = 0; j < 8; ++j) V::store(scores + L * j, acc[j]);
}

// ot[L (d + e) + lane] = ot[...] * scale + sum over keys j in [j_begin, j_end] of p[L j + lane] *
// v[j][d + e], for e < C: C independent FMA chains (one per output element, L lanes each).
template <class V, int C>
PAGODA_LANES_INLINE void lane_weigh_values(float* ot, typename V::vec scale, const float* p, const float* const* v,
                                           int64_t j_begin, int64_t j_end, int64_t d) {
  constexpr int64_t L = V::kLanes;
  typename V::vec acc[C];
  for (int e = 0; e < C; ++e) acc[e] = V::mul(V::load(ot + L * (d + e)), scale);
  for (int64_t j = j_begin; j <= j_end; ++j) {
    const typename V::vec pj = V::load(p + L * j);
    for (int e = 0; e < C; ++e) acc[e] = V::fmadd(pj, V::broadcast(v[j] + d + e), acc[e]);
  }
  for (int e = 0; e < C; ++e) V::store(ot + L * (d + e), acc[e]);
}

// (tile_rows and kKeyTile serve attention_avx2.cpp's one-vector kernel too.)
// kp[t - t0] and vp[t - t0]: the cached K and V rows of positions t in [first, last], all in the
// tile starting at t0 (one division a tile, not one a key).
// A cache of another dtype: those rows converted into a.converted first.
PAGODA_LANES_INLINE void tile_rows(const AttentionTile& a, int64_t t0, int64_t first, int64_t last,
                                   const float** kp, const float** vp) {
  if (a.key_rows != nullptr) {
    float* keys = a.converted;
    float* values = a.converted + kKeyTile * a.head_dim;
    kv_rows_to_f32_avx2(*a.key_rows, first, last - first + 1, keys);
    kv_rows_to_f32_avx2(*a.value_rows, first, last - first + 1, values);
    for (int64_t t = first; t <= last; ++t) {
      kp[t - t0] = keys + (t - first) * a.head_dim;
      vp[t - t0] = values + (t - first) * a.head_dim;
    }
    return;
  }
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

// Key tiles ahead of the one computed whose rows are prefetched (a tile of a decode step's 8
// vectors computes for a few hundred nanoseconds, about one DRAM latency).
constexpr int64_t kPrefetchTiles = 2;

// Starts loading the K and V rows of positions [first, last] into the caches. A kernel walks one
// kv head's rows, num_kv_heads * head_dim elements apart (1 KiB for TinyLlama's f32 cache), and
// the hardware prefetchers follow such strides only within a 4 KiB page: without this a long
// context's decode, whose rows come from DRAM, waited on every tile (7 to 10 GB/s of a 52 GB/s
// machine, docs/benchmarks.md).
PAGODA_LANES_INLINE void prefetch_rows(const AttentionTile& a, int64_t first, int64_t last) {
  const KvRowSource* rows = a.key_rows;
  const int64_t elem = rows == nullptr ? 4
                       : rows->format == KvRowFormat::kF16 || rows->format == KvRowFormat::kBF16 ? 2
                                                                                                 : 1;
  const int64_t bytes = a.head_dim * elem;
  const int32_t* table = rows == nullptr ? a.block_table : rows->block_table;
  int64_t block = first / a.block_size, offset = first % a.block_size;
  for (int64_t t = first; t <= last; ++t) {
    const int64_t slot = static_cast<int64_t>(table[block]) * a.block_size + offset;
    const char* k;
    const char* v;
    if (rows == nullptr) {
      k = reinterpret_cast<const char*>(a.key + slot * a.kv_slot_stride);
      v = reinterpret_cast<const char*>(a.value + slot * a.kv_slot_stride);
    } else {
      const int64_t at = (slot * rows->num_kv_heads + rows->kv_head) * bytes;
      k = static_cast<const char*>(rows->data) + at;
      v = static_cast<const char*>(a.value_rows->data) + at;
    }
    for (int64_t b = 0; b < bytes; b += 64) {
      __builtin_prefetch(k + b);
      __builtin_prefetch(v + b);
    }
    if (++offset == a.block_size) {
      ++block;
      offset = 0;
    }
  }
}

// The tile's attention, its scratch ceil(num_vectors / L) * (2 L head_dim + 2 L) floats.
template <class V>
PAGODA_LANES_INLINE void attention_tile_lanes(const AttentionTile& a) {
  using vec = typename V::vec;
  constexpr int64_t L = V::kLanes;
  const int64_t hd = a.head_dim;
  const int64_t num_vecs = a.num_rows * a.num_group_heads;
  const int64_t groups = (num_vecs + L - 1) / L;
  float* qt = a.scratch;             // [groups][hd][L]: the queries, times the scale
  float* ot = qt + groups * hd * L;  // [groups][hd][L]: the unnormalised outputs
  float* mx = ot + groups * hd * L;  // [groups][L]: running maximum
  float* den = mx + groups * L;      // [groups][L]: running denominator
  alignas(64) int32_t lane_lo[kMaxLaneVectors + L];  // a lane's keys: [lo, hi] (none if lo > hi)
  alignas(64) int32_t lane_hi[kMaxLaneVectors + L];
  for (int64_t v = 0; v < groups * L; ++v) {
    const int64_t grp = v / L, lane = v % L;
    float* q_lane = qt + grp * hd * L + lane;
    if (v < num_vecs) {
      const int64_t r = v / a.num_group_heads, g = v % a.num_group_heads;
      const int64_t pos = a.first_pos + r;
      lane_hi[v] = static_cast<int32_t>(pos);
      lane_lo[v] = static_cast<int32_t>(a.sliding_window > 0 ? pos - a.sliding_window + 1 : 0);
      const float* q = a.q + r * a.row_stride + g * hd;
      for (int64_t d = 0; d < hd; ++d) q_lane[L * d] = q[d] * a.scale;
    } else {  // padding: no keys
      lane_hi[v] = -1;
      lane_lo[v] = 0;
      for (int64_t d = 0; d < hd; ++d) q_lane[L * d] = 0;
    }
    mx[v] = -__builtin_inff();
    den[v] = 0;
  }
  for (int64_t i = 0; i < groups * hd * L; ++i) ot[i] = 0;

  const int64_t last_pos = a.first_pos + a.num_rows - 1;
  int64_t lowest = 0;
  if (a.sliding_window > 0 && a.first_pos - a.sliding_window + 1 > 0) {
    lowest = a.first_pos - a.sliding_window + 1;
  }

  const float* kp[kKeyTile];
  const float* vp[kKeyTile];
  alignas(64) float tile[kKeyTile * L];  // per key: its L lanes' score, then weight
  const vec neg_inf = V::set1(-__builtin_inff());
  const int64_t t_begin = lowest - lowest % kKeyTile;
  prefetch_rows(a, lowest, t_begin + kPrefetchTiles * kKeyTile - 1 < last_pos ? t_begin + kPrefetchTiles * kKeyTile - 1 : last_pos);
  for (int64_t t0 = t_begin; t0 <= last_pos; t0 += kKeyTile) {
    // Keys [first, last] of this tile are in range for some lane; the others point at `first`'s
    // row (read, then masked) so that every pointer is valid.
    const int64_t first = t0 < lowest ? lowest : t0;
    const int64_t last = t0 + kKeyTile - 1 < last_pos ? t0 + kKeyTile - 1 : last_pos;
    if (const int64_t ahead = t0 + kPrefetchTiles * kKeyTile; ahead <= last_pos) {
      prefetch_rows(a, ahead, ahead + kKeyTile - 1 < last_pos ? ahead + kKeyTile - 1 : last_pos);
    }
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
      const float* q = qt + grp * hd * L;
      for (int64_t half = 0; half < kKeyTile / 8; ++half) {
        if (8 * half <= j_end && 8 * half + 7 >= j_begin) lane_scores8<V>(q, kp + 8 * half, hd, tile + 8 * L * half);
      }
      // Mask the keys outside each lane's range; the tile's maximum per lane.
      vec tile_max = neg_inf;
      for (int64_t j = j_begin; j <= j_end; ++j) {
        const vec s = V::outside_to_neg_inf(V::load(tile + L * j), lane_lo + L * grp, lane_hi + L * grp,
                                            static_cast<int32_t>(t0 + j));
        V::store(tile + L * j, s);
        tile_max = V::max(tile_max, s);
      }
      const vec old_max = V::load(mx + L * grp);
      const vec new_max = V::max(old_max, tile_max);
      // Unchanged maximum (including a tile with none of the lane's keys): exactly 1.
      const vec scale_old = V::one_where_equal(old_max, new_max, V::exp(V::sub(old_max, new_max)));
      vec sum = V::zero();
      for (int64_t j = j_begin; j <= j_end; ++j) {
        const vec s = V::load(tile + L * j);
        // Masked keys weigh exactly 0 (exp alone would give a tiny value, or NaN from -inf - -inf).
        const vec p = V::zero_where_neg_inf(s, V::exp(V::sub(s, new_max)));
        V::store(tile + L * j, p);
        sum = V::add(sum, p);
      }
      V::store(mx + L * grp, new_max);
      V::store(den + L * grp, V::fmadd(V::load(den + L * grp), scale_old, sum));
      float* o = ot + grp * hd * L;
      int64_t d = 0;
      for (; d + 8 <= hd; d += 8) lane_weigh_values<V, 8>(o, scale_old, tile, vp, j_begin, j_end, d);
      for (; d < hd; ++d) lane_weigh_values<V, 1>(o, scale_old, tile, vp, j_begin, j_end, d);
    }
  }
  for (int64_t v = 0; v < num_vecs; ++v) {
    const int64_t grp = v / L, lane = v % L;
    const int64_t r = v / a.num_group_heads, g = v % a.num_group_heads;
    const float inv = den[v] > 0 ? 1.0f / den[v] : 0.0f;
    const float* o_lane = ot + grp * hd * L + lane;
    float* out = a.out + r * a.row_stride + g * hd;
    for (int64_t d = 0; d < hd; ++d) out[d] = o_lane[L * d] * inv;
    if (a.lse != nullptr) a.lse[r * a.lse_row_stride + g] = den[v] > 0 ? mx[v] + __builtin_logf(den[v]) : -__builtin_inff();
  }
}

#undef PAGODA_LANES_INLINE

}  // namespace
}  // namespace pagoda::cpu
