// The AVX2 + FMA paged-attention leaf: one sequence, one kv head, a tile of query rows and the
// query heads that read that kv head (GQA); and the conversion of a non-f32 cache's rows to f32.
// Built with -mavx2 -mfma -mf16c; read x86_kernels.h before adding an #include.
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

#include "backend/cpu/x86/attention_lanes.h"
#include "backend/cpu/x86/math_avx2.h"
#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {
namespace {

#define PAGODA_ATT_INLINE inline __attribute__((always_inline))

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
  const int64_t t_begin = lowest - lowest % kKeyTile;
  prefetch_rows(a, lowest,
                t_begin + kPrefetchTiles * kKeyTile - 1 < last_pos ? t_begin + kPrefetchTiles * kKeyTile - 1 : last_pos);
  for (int64_t t0 = t_begin; t0 <= last_pos; t0 += kKeyTile) {
    const int64_t t_end = t0 + kKeyTile - 1 < last_pos ? t0 + kKeyTile - 1 : last_pos;  // inclusive
    const int64_t first = t0 < lowest ? lowest : t0;
    if (const int64_t ahead = t0 + kPrefetchTiles * kKeyTile; ahead <= last_pos) {
      prefetch_rows(a, ahead, ahead + kKeyTile - 1 < last_pos ? ahead + kKeyTile - 1 : last_pos);
    }
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
      if (a.lse != nullptr) {
        a.lse[r * a.lse_row_stride + g] = denom[vi] > 0 ? max_score[vi] + __builtin_logf(denom[vi]) : -__builtin_inff();
      }
    }
}


// ---- Query vectors across the lanes (GQA groups of 4 or more): attention_lanes.h on 8 lanes ----
namespace {

struct Avx2Lanes {
  static constexpr int64_t kLanes = 8;
  using vec = __m256;
  static PAGODA_ATT_INLINE vec zero() { return _mm256_setzero_ps(); }
  static PAGODA_ATT_INLINE vec set1(float f) { return _mm256_set1_ps(f); }
  static PAGODA_ATT_INLINE vec load(const float* p) { return _mm256_loadu_ps(p); }
  static PAGODA_ATT_INLINE void store(float* p, vec v) { _mm256_storeu_ps(p, v); }
  static PAGODA_ATT_INLINE vec broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static PAGODA_ATT_INLINE vec fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static PAGODA_ATT_INLINE vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static PAGODA_ATT_INLINE vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static PAGODA_ATT_INLINE vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
  static PAGODA_ATT_INLINE vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
  static PAGODA_ATT_INLINE vec exp(vec x) { return avx2::exp(x); }
  static PAGODA_ATT_INLINE vec outside_to_neg_inf(vec s, const int32_t* lo, const int32_t* hi, int32_t t) {
    const __m256i tv = _mm256_set1_epi32(t);
    const __m256i outside = _mm256_or_si256(_mm256_cmpgt_epi32(tv, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hi))),
                                            _mm256_cmpgt_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(lo)), tv));
    return _mm256_blendv_ps(s, _mm256_set1_ps(-__builtin_inff()), _mm256_castsi256_ps(outside));
  }
  static PAGODA_ATT_INLINE vec one_where_equal(vec a, vec b, vec v) {
    return _mm256_blendv_ps(v, _mm256_set1_ps(1.0f), _mm256_cmp_ps(a, b, _CMP_EQ_OQ));
  }
  static PAGODA_ATT_INLINE vec zero_where_neg_inf(vec s, vec p) {
    return _mm256_and_ps(p, _mm256_cmp_ps(s, _mm256_set1_ps(-__builtin_inff()), _CMP_NEQ_OQ));
  }
};

// ---- Cache rows to f32 ----

// 8 elements of a cache row as f32, from their bytes at p; int8 codes times `scale`.
template <KvRowFormat F>
PAGODA_ATT_INLINE __m256 row8_to_f32(const uint8_t* p, __m256 scale) {
  if constexpr (F == KvRowFormat::kF16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if constexpr (F == KvRowFormat::kBF16) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  } else if constexpr (F == KvRowFormat::kInt8) {
    const __m128i codes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_mul_ps(scale, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(codes)));
  } else {
    // fp8 without a float operation on a subnormal (so a thread with denormals-are-zero set gets
    // the same values): a normal code's exponent and mantissa bits moved to f32's and rebiased by
    // an integer add; a subnormal's mantissa converted and scaled by its power of two; the sign
    // ORed in last. E4M3 (bias 7, 3 mantissa bits) has NaN only at S.1111.111; E5M2 (bias 15, 2
    // bits) has fp16's infinities and NaNs.
    constexpr bool e4m3 = F == KvRowFormat::kFp8E4M3;
    constexpr int kMantissaBits = e4m3 ? 3 : 2;
    constexpr int kBias = e4m3 ? 7 : 15;
    constexpr int kExponentMask = e4m3 ? 0x78 : 0x7C;
    const __m256i u = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x80)), 24);
    const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7F));
    const __m256i normal_bits =
        _mm256_add_epi32(_mm256_slli_epi32(mag, 23 - kMantissaBits), _mm256_set1_epi32((127 - kBias) << 23));
    // A subnormal code is its mantissa m times 2^(1 - bias - mantissa bits).
    const __m256 subnormal = _mm256_mul_ps(_mm256_cvtepi32_ps(mag), _mm256_set1_ps(e4m3 ? 0x1p-9f : 0x1p-16f));
    const __m256i is_subnormal = _mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(kExponentMask)),
                                                    _mm256_setzero_si256());
    __m256 v = _mm256_blendv_ps(_mm256_castsi256_ps(normal_bits), subnormal, _mm256_castsi256_ps(is_subnormal));
    __m256i nan;
    if constexpr (e4m3) {
      nan = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7F));
    } else {
      const __m256i inf = _mm256_cmpeq_epi32(mag, _mm256_set1_epi32(0x7C));
      v = _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_inff()), _mm256_castsi256_ps(inf));
      nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7C));
    }
    v = _mm256_blendv_ps(v, _mm256_set1_ps(__builtin_nanf("")), _mm256_castsi256_ps(nan));
    return _mm256_or_ps(v, _mm256_castsi256_ps(sign));
  }
}

template <KvRowFormat F>
void rows_to_f32(const KvRowSource& r, int64_t first, int64_t count, float* out) {
  constexpr int64_t kWidth = F == KvRowFormat::kF16 || F == KvRowFormat::kBF16 ? 2 : 1;  // bytes
  const int64_t hd = r.head_dim;
  const auto* base = static_cast<const uint8_t*>(r.data);
  int64_t block = first / r.block_size, offset = first % r.block_size;
  for (int64_t t = 0; t < count; ++t) {
    const int64_t row = (static_cast<int64_t>(r.block_table[block]) * r.block_size + offset) * r.num_kv_heads + r.kv_head;
    const uint8_t* p = base + row * hd * kWidth;
    const __m256 scale = _mm256_set1_ps(F == KvRowFormat::kInt8 ? r.scales[row] : 1.0f);
    float* o = out + t * hd;
    int64_t d = 0;
    for (; d + 8 <= hd; d += 8) _mm256_storeu_ps(o + d, row8_to_f32<F>(p + d * kWidth, scale));
    if (d < hd) {  // the tail through a zero-padded copy
      alignas(32) uint8_t tail[8 * kWidth] = {};
      alignas(32) float tail_out[8];
      for (int64_t i = 0; i < (hd - d) * kWidth; ++i) tail[i] = p[d * kWidth + i];
      _mm256_store_ps(tail_out, row8_to_f32<F>(tail, scale));
      for (int64_t i = 0; i < hd - d; ++i) o[d + i] = tail_out[i];
    }
    if (++offset == r.block_size) {
      ++block;
      offset = 0;
    }
  }
}

}  // namespace

void attention_tile_lanes_avx2(const AttentionTile& a) { attention_tile_lanes<Avx2Lanes>(a); }

void kv_rows_to_f32_avx2(const KvRowSource& rows, int64_t first, int64_t count, float* out) {
  switch (rows.format) {
    case KvRowFormat::kF16: return rows_to_f32<KvRowFormat::kF16>(rows, first, count, out);
    case KvRowFormat::kBF16: return rows_to_f32<KvRowFormat::kBF16>(rows, first, count, out);
    case KvRowFormat::kFp8E4M3: return rows_to_f32<KvRowFormat::kFp8E4M3>(rows, first, count, out);
    case KvRowFormat::kFp8E5M2: return rows_to_f32<KvRowFormat::kFp8E5M2>(rows, first, count, out);
    case KvRowFormat::kInt8: return rows_to_f32<KvRowFormat::kInt8>(rows, first, count, out);
  }
}

}  // namespace pagoda::cpu
