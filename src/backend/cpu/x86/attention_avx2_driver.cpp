// The work split of the AVX2 and AVX-512 paged attention, built with baseline flags (see
// x86_kernels.h).
#include <algorithm>
#include <vector>

#include "backend/kernels.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/kv_rows.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/check.h"
#include "base/thread_pool.h"

namespace pagoda::cpu {
namespace {

// Query vectors (rows x heads of one group) that share one pass over a key tile: enough to reuse
// each K/V tile many times from L1, few enough that a prefill splits into many units of work.
constexpr int64_t kVectorsPerTile = 32;
constexpr int64_t kMaxGroupHeads = 64;  // wider GQA groups are split into several tiles
// The most query vectors one tile can hold: kVectorsPerTile rows' worth, or one row of a
// kMaxGroupHeads group.
constexpr int64_t kMaxVectors = std::max(kVectorsPerTile, kMaxGroupHeads);
// Below this many multiply-adds (q.k and p.v together) waking the workers costs more than it saves.
constexpr int64_t kMinParallelMacs = int64_t{1} << 17;
// Smallest GQA group computed with query vectors across the lanes (at 8 lanes, half of them used
// in decode).
constexpr int64_t kMinLaneGroupHeads = 4;

struct WorkItem {
  int64_t seq;
  int64_t kv_head;
  int64_t head_begin;  // first query head of the tile (within kv_head's group)
  int64_t num_heads;
  int64_t row_begin;   // first query row of the tile (within the sequence)
  int64_t num_rows;
};

// The lane kernel of a table and its width, and for tiles of at most 8 query vectors (decode) the
// 8-lane one: the same bits (attention_lanes.h), without the wider kernel's empty lanes (16 lanes
// of which 8 are used measured 7 to 15% slower in decode).
struct LaneKernel {
  void (*tile)(const AttentionTile&);
  int64_t lanes;
  void (*narrow)(const AttentionTile&) = nullptr;
};

void paged_attention_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs, const KvLayerView& cache,
                            const AttentionParams& p, float* out, ThreadPool* pool, LaneKernel lane_kernel) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  PAGODA_CHECK(group * p.num_kv_heads == p.num_heads);
  const int64_t heads_per_tile = std::min(group, kMaxGroupHeads);
  const int64_t rows_per_tile = std::max<int64_t>(1, kVectorsPerTile / heads_per_tile);

  // Reused across calls (one per layer per step). A reference, so that the workers running
  // `run` below read the calling thread's list, not their own thread_local one.
  thread_local std::vector<WorkItem> items_of_this_thread;
  std::vector<WorkItem>& items = items_of_this_thread;
  items.clear();
  int64_t macs = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const AttentionSeq& seq = seqs[s];
    macs += seq.num_query * seq.context_len * p.num_heads * p.head_dim * 2;
    for (int64_t kvh = 0; kvh < p.num_kv_heads; ++kvh)
      for (int64_t h0 = 0; h0 < group; h0 += heads_per_tile)
        for (int64_t r0 = 0; r0 < seq.num_query; r0 += rows_per_tile)
          items.push_back({s, kvh, h0, std::min(heads_per_tile, group - h0), r0,
                           std::min(rows_per_tile, seq.num_query - r0)});
  }

  const int64_t row_stride = p.num_heads * p.head_dim;
  const int64_t slot_stride = cache.num_kv_heads * cache.head_dim;
  PAGODA_CHECK(rows_per_tile * heads_per_tile <= kMaxVectors);
  // Query vectors across the lanes once a group fills half of them (see x86_kernels.h). Chosen
  // from the model's shape alone, so every tile of every step rounds the same way.
  const bool lanes = group >= kMinLaneGroupHeads;
  static_assert(kMaxVectors <= 8 * kMaxLaneGroups);
  // A lane kernel of width w needs ceil(vectors / w) * (2 w head_dim + 2 w) floats (attention_lanes.h).
  auto lane_scratch = [&](int64_t w) { return (kMaxVectors + w - 1) / w * (2 * w * p.head_dim + 2 * w); };
  const auto scratch_floats =
      static_cast<size_t>(lanes ? std::max(lane_scratch(lane_kernel.lanes), lane_scratch(8)) : 2 * kMaxVectors);
  const bool f32_cache = cache.dtype == KvCacheDtype::kF32;
  auto run = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch_of_this_thread;  // each worker's own
    std::vector<float>& scratch = scratch_of_this_thread;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    // A cache of another dtype: the tile's kv head's keys and values up to its last position,
    // converted to f32 rows [position][head_dim], read through an identity block table.
    thread_local std::vector<float> keys_of_this_thread, values_of_this_thread;
    thread_local std::vector<int32_t> identity_of_this_thread;
    for (int64_t i = begin; i < end; ++i) {
      const WorkItem& w = items[static_cast<size_t>(i)];
      const AttentionSeq& seq = seqs[w.seq];
      const int64_t head = w.kv_head * group + w.head_begin;
      const int64_t row = seq.query_start + w.row_begin;
      const int64_t offset = row * row_stride + head * p.head_dim;
      const int64_t first_pos = seq.context_len - seq.num_query + w.row_begin;
      const float* key = nullptr;
      const float* value = nullptr;
      int64_t kv_slot_stride = slot_stride;
      const int32_t* block_table = seq.block_table;
      if (f32_cache) {
        key = static_cast<const float*>(cache.key) + w.kv_head * cache.head_dim;
        value = static_cast<const float*>(cache.value) + w.kv_head * cache.head_dim;
      } else {
        const int64_t positions = first_pos + w.num_rows;  // 0 .. the tile's last position
        std::vector<float>& keys = keys_of_this_thread;
        std::vector<float>& values = values_of_this_thread;
        std::vector<int32_t>& identity = identity_of_this_thread;
        keys.resize(static_cast<size_t>(positions * p.head_dim));
        values.resize(keys.size());
        for (int64_t t = 0; t < positions; ++t) {
          const int64_t slot = seq.block_table[t / cache.block_size] * cache.block_size + t % cache.block_size;
          read_kv_row(cache, false, slot, w.kv_head, keys.data() + t * p.head_dim);
          read_kv_row(cache, true, slot, w.kv_head, values.data() + t * p.head_dim);
        }
        const int64_t blocks = (positions + cache.block_size - 1) / cache.block_size;
        for (auto b = static_cast<int64_t>(identity.size()); b < blocks; ++b) identity.push_back(static_cast<int32_t>(b));
        key = keys.data();
        value = values.data();
        kv_slot_stride = p.head_dim;
        block_table = identity.data();
      }
      const AttentionTile tile{
          .q = q + offset,
          .out = out + offset,
          .row_stride = row_stride,
          .num_rows = w.num_rows,
          .num_group_heads = w.num_heads,
          .head_dim = p.head_dim,
          .first_pos = first_pos,
          .key = key,
          .value = value,
          .kv_slot_stride = kv_slot_stride,
          .block_table = block_table,
          .block_size = cache.block_size,
          .scale = p.scale,
          .sliding_window = p.sliding_window,
          .scratch = scratch.data(),
      };
      if (lanes) {
        const bool narrow = lane_kernel.narrow != nullptr && w.num_rows * w.num_heads <= 8;
        (narrow ? lane_kernel.narrow : lane_kernel.tile)(tile);
      } else {
        attention_tile_avx2(tile);
      }
    }
  };
  const auto n = static_cast<int64_t>(items.size());
  if (pool == nullptr || macs < kMinParallelMacs) {
    run(0, n);
  } else {
    pool->parallel_for(n, run);
  }
}

}  // namespace

void paged_attention_avx2_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                                 const KvLayerView& cache, const AttentionParams& params, float* out,
                                 ThreadPool* pool) {
  paged_attention_pooled(q, seqs, num_seqs, cache, params, out, pool, {attention_tile_lanes_avx2, 8});
}

void paged_attention_avx2(const ExecContext& ctx, const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                          const KvLayerView& cache, const AttentionParams& params, float* out) {
  paged_attention_avx2_pooled(q, seqs, num_seqs, cache, params, out, &pool_of(ctx));
}

void paged_attention_avx512_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                                   const KvLayerView& cache, const AttentionParams& params, float* out,
                                   ThreadPool* pool) {
  paged_attention_pooled(q, seqs, num_seqs, cache, params, out, pool,
                         {attention_tile_lanes_avx512, 16, attention_tile_lanes_avx2});
}

void paged_attention_avx512(const ExecContext& ctx, const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                            const KvLayerView& cache, const AttentionParams& params, float* out) {
  paged_attention_avx512_pooled(q, seqs, num_seqs, cache, params, out, &pool_of(ctx));
}

}  // namespace pagoda::cpu
