// The work split of the AVX2 and AVX-512 paged attention, built with baseline flags (see
// x86_kernels.h).
#include <algorithm>
#include <vector>

#include "backend/kernels.h"
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/check.h"
#include "base/thread_pool.h"

namespace pagoda::cpu {
namespace {

// Query vectors (rows x heads of one group) that share one pass over a key tile: enough to reuse
// each K/V tile many times from L1, few enough that a prefill splits into many units of work and
// a tile's outputs stay in L1. 64 rather than 32: a 32k prompt's K/V of one kv head (16 MB in f32)
// no longer fits the L3 beside another core's, so each pass over it costs DRAM or L3 reads; twice
// the vectors per pass made a 2,048-token chunk at the end of a 32k prompt 86 -> 108-111 G
// multiply-adds/s (Zen 5, 2 threads), the same at 8k.
constexpr int64_t kVectorsPerTile = 64;
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

// The row format of a cache that is not f32.
KvRowFormat row_format(KvCacheDtype t) {
  switch (t) {
    case KvCacheDtype::kF16: return KvRowFormat::kF16;
    case KvCacheDtype::kBF16: return KvRowFormat::kBF16;
    case KvCacheDtype::kFp8E4M3: return KvRowFormat::kFp8E4M3;
    case KvCacheDtype::kFp8E5M2: return KvRowFormat::kFp8E5M2;
    case KvCacheDtype::kInt8: return KvRowFormat::kInt8;
    case KvCacheDtype::kF32: break;
  }
  PAGODA_CHECK(false && "an f32 cache is read in place");
  return KvRowFormat::kF16;
}

// Reorders tiles of ascending rows as first, last, second, second to last, ...: a causal tile's
// work grows with its row, and the pool hands each thread one contiguous range, so in order the
// last thread would get the longest rows (a whole prompt: 3 times the first's work of 2). The
// order of tiles changes no result.
void interleave_ends(std::vector<WorkItem>& items) {
  std::vector<WorkItem> in(items.begin(), items.end());
  size_t lo = 0, hi = in.size();
  for (size_t i = 0; i < in.size(); ++i) items[i] = i % 2 == 0 ? in[lo++] : in[--hi];
}

// Positions converted per unit of work when a sequence's rows are converted in parallel.
constexpr int64_t kConvertChunk = 256;

void paged_attention_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs, const KvLayerView& cache,
                            const AttentionParams& p, float* out, float* lse, ThreadPool* pool, LaneKernel lane_kernel) {
  const int64_t group = p.num_heads / p.num_kv_heads;
  PAGODA_CHECK(group * p.num_kv_heads == p.num_heads);
  const int64_t heads_per_tile = std::min(group, kMaxGroupHeads);
  const int64_t rows_per_tile = std::max<int64_t>(1, kVectorsPerTile / heads_per_tile);
  const bool f32_cache = cache.dtype == KvCacheDtype::kF32;

  // A cache of another dtype is read as f32 rows. A sequence with one tile of rows per kv head
  // (decode) has them converted by its tile, 16 positions at a time (AttentionTile::key_rows), so
  // they stay in L1; one with several (a prefill chunk) has them converted once, in parallel, into
  // `shared` ([position][head_dim], read through an identity block table), and its tiles then run
  // over that copy one kv head at a time, so that a long prompt's K and V are not converted again
  // by each of its tiles. Either way the tiles read the same f32 values.
  auto source = [&](const AttentionSeq& seq, int64_t kv_head, bool value) {
    return KvRowSource{row_format(cache.dtype), value ? cache.value : cache.key,
                       value ? cache.value_scales : cache.key_scales, cache.num_kv_heads, cache.head_dim,
                       cache.block_size, kv_head, seq.block_table};
  };
  auto shares_conversion = [&](const AttentionSeq& seq) { return !f32_cache && seq.num_query > rows_per_tile; };

  // Reused across calls (one per layer per step). References, so that the workers running `run`
  // below read the calling thread's lists and copies, not their own thread_local ones.
  thread_local std::vector<WorkItem> items_of_this_thread, shared_items_of_this_thread;
  thread_local std::vector<float> shared_keys_of_this_thread, shared_values_of_this_thread;
  std::vector<WorkItem>& items = items_of_this_thread;
  std::vector<WorkItem>& shared_items = shared_items_of_this_thread;
  std::vector<float>& shared_keys = shared_keys_of_this_thread;
  std::vector<float>& shared_values = shared_values_of_this_thread;
  items.clear();
  auto add_tiles = [&](int64_t s, int64_t kvh, std::vector<WorkItem>& to) {
    const AttentionSeq& seq = seqs[s];
    for (int64_t h0 = 0; h0 < group; h0 += heads_per_tile)
      for (int64_t r0 = 0; r0 < seq.num_query; r0 += rows_per_tile)
        to.push_back({s, kvh, h0, std::min(heads_per_tile, group - h0), r0, std::min(rows_per_tile, seq.num_query - r0)});
  };
  int64_t macs = 0;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const AttentionSeq& seq = seqs[s];
    macs += seq.num_query * seq.context_len * p.num_heads * p.head_dim * 2;
    if (shares_conversion(seq)) continue;
    for (int64_t kvh = 0; kvh < p.num_kv_heads; ++kvh) add_tiles(s, kvh, items);
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
  // The identity block table of converted rows, long enough for every sequence.
  thread_local std::vector<int32_t> identity_of_this_thread;
  std::vector<int32_t>& identity = identity_of_this_thread;
  int64_t most_blocks = 0;
  for (int64_t s = 0; s < num_seqs; ++s)
    most_blocks = std::max(most_blocks, (seqs[s].context_len + cache.block_size - 1) / cache.block_size);
  for (auto b = static_cast<int64_t>(identity.size()); b < most_blocks; ++b) identity.push_back(static_cast<int32_t>(b));

  // Runs tiles [begin, end) of `list`; converted: their keys and values are `shared`.
  auto run = [&](const std::vector<WorkItem>& list, bool converted, int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch_of_this_thread;  // each worker's own
    std::vector<float>& scratch = scratch_of_this_thread;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    thread_local std::vector<float> converted_of_this_thread;  // a key tile's rows, converted
    std::vector<float>& converted_rows = converted_of_this_thread;
    for (int64_t i = begin; i < end; ++i) {
      const WorkItem& w = list[static_cast<size_t>(i)];
      const AttentionSeq& seq = seqs[w.seq];
      const int64_t head = w.kv_head * group + w.head_begin;
      const int64_t row = seq.query_start + w.row_begin;
      const int64_t offset = row * row_stride + head * p.head_dim;
      const int64_t first_pos = seq.context_len - seq.num_query + w.row_begin;
      const float* key = nullptr;
      const float* value = nullptr;
      int64_t kv_slot_stride = p.head_dim;
      const int32_t* block_table = identity.data();
      KvRowSource key_rows{}, value_rows{};
      if (converted) {
        key = shared_keys.data();
        value = shared_values.data();
      } else if (f32_cache) {
        key = static_cast<const float*>(cache.key) + w.kv_head * cache.head_dim;
        value = static_cast<const float*>(cache.value) + w.kv_head * cache.head_dim;
        kv_slot_stride = slot_stride;
        block_table = seq.block_table;
      } else {  // converted by the tile, a key tile at a time
        key_rows = source(seq, w.kv_head, false);
        value_rows = source(seq, w.kv_head, true);
        if (converted_rows.size() < static_cast<size_t>(2 * kAttentionKeyTile * p.head_dim))
          converted_rows.resize(static_cast<size_t>(2 * kAttentionKeyTile * p.head_dim));
      }
      const bool own_conversion = !converted && !f32_cache;
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
          .key_rows = own_conversion ? &key_rows : nullptr,
          .value_rows = own_conversion ? &value_rows : nullptr,
          .converted = own_conversion ? converted_rows.data() : nullptr,
          .lse = lse != nullptr ? lse + row * p.num_heads + head : nullptr,
          .lse_row_stride = p.num_heads,
      };
      if (lanes) {
        const bool narrow = lane_kernel.narrow != nullptr && w.num_rows * w.num_heads <= 8;
        (narrow ? lane_kernel.narrow : lane_kernel.tile)(tile);
      } else {
        attention_tile_avx2(tile);
      }
    }
  };
  const bool threaded = pool != nullptr && macs >= kMinParallelMacs;
  auto run_all = [&](const std::vector<WorkItem>& list, bool converted) {
    const auto n = static_cast<int64_t>(list.size());
    if (threaded) {
      pool->parallel_for(n, [&](int64_t begin, int64_t end) { run(list, converted, begin, end); });
    } else {
      run(list, converted, 0, n);
    }
  };
  run_all(items, false);

  for (int64_t s = 0; s < num_seqs; ++s) {
    const AttentionSeq& seq = seqs[s];
    if (!shares_conversion(seq)) continue;
    shared_keys.resize(static_cast<size_t>(seq.context_len * p.head_dim));
    shared_values.resize(shared_keys.size());
    for (int64_t kvh = 0; kvh < p.num_kv_heads; ++kvh) {
      const KvRowSource keys = source(seq, kvh, false), values = source(seq, kvh, true);
      auto convert = [&](int64_t begin, int64_t end) {
        for (int64_t c = begin; c < end; ++c) {
          const int64_t first = c * kConvertChunk, count = std::min(kConvertChunk, seq.context_len - first);
          kv_rows_to_f32_avx2(keys, first, count, shared_keys.data() + first * p.head_dim);
          kv_rows_to_f32_avx2(values, first, count, shared_values.data() + first * p.head_dim);
        }
      };
      const int64_t chunks = (seq.context_len + kConvertChunk - 1) / kConvertChunk;
      if (threaded) {
        pool->parallel_for(chunks, convert);
      } else {
        convert(0, chunks);
      }
      shared_items.clear();
      add_tiles(s, kvh, shared_items);
      interleave_ends(shared_items);
      run_all(shared_items, true);
    }
  }
}

}  // namespace

void paged_attention_avx2_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                                 const KvLayerView& cache, const AttentionParams& params, float* out, float* lse,
                                 ThreadPool* pool) {
  paged_attention_pooled(q, seqs, num_seqs, cache, params, out, lse, pool, {attention_tile_lanes_avx2, 8});
}

void paged_attention_avx2(const ExecContext& ctx, const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                          const KvLayerView& cache, const AttentionParams& params, float* out, float* lse) {
  paged_attention_avx2_pooled(q, seqs, num_seqs, cache, params, out, lse, &pool_of(ctx));
}

void paged_attention_avx512_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                                   const KvLayerView& cache, const AttentionParams& params, float* out, float* lse,
                                   ThreadPool* pool) {
  paged_attention_pooled(q, seqs, num_seqs, cache, params, out, lse, pool,
                         {attention_tile_lanes_avx512, 16, attention_tile_lanes_avx2});
}

void paged_attention_avx512(const ExecContext& ctx, const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                            const KvLayerView& cache, const AttentionParams& params, float* out, float* lse) {
  paged_attention_avx512_pooled(q, seqs, num_seqs, cache, params, out, lse, &pool_of(ctx));
}

}  // namespace pagoda::cpu
