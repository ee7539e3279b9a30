// Checks the AVX2 and AVX-512 paged attention against a float64 softmax attention written here, on
// random caches: head sizes with odd tails, GQA group sizes (below 4: one query vector at a time;
// 4 and up: query vectors across the lanes, 8 or 16 of them), block sizes around the 16-key tile,
// prefill chunks, sliding windows, several sequences at once and threaded; that a query's result
// is the same bits whatever else is in the batch, however its prefill is chunked, and whatever
// the thread count; and that the two give the same bits. Long prompts (8k and 32k tokens, a
// needle at position 30,000) and the conversion of non-f32 caches' rows too.
#include <gtest/gtest.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/kernels.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernel_table_test_support.h"
#include "backend/cpu/kv_rows.h"
#include "backend/cpu/scalar/reference_kernels.h"
#include "backend/cpu/testing_context.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/thread_pool.h"

namespace pagoda::cpu {
namespace {

// A paged cache of random keys and values, with each sequence's blocks scattered (shuffled ids).
// For a dtype other than f32, `view` is the cache in that dtype (stored by write_kv_row) and
// key / value hold what it holds, read back as f32: the values the attention must use.
struct Cache {
  std::vector<float> key, value;
  std::vector<uint8_t> typed_key, typed_value;
  std::vector<float> key_scales, value_scales;
  KvLayerView view;
  std::vector<std::vector<BlockId>> tables;  // per sequence
};

void convert_cache(Cache& c, KvCacheDtype dtype) {
  if (dtype == KvCacheDtype::kF32) return;
  KvLayerView& v = c.view;
  const int64_t rows = v.num_blocks * v.block_size * v.num_kv_heads;
  c.typed_key.assign(static_cast<size_t>(rows * v.head_dim * kv_cache_elem_bytes(dtype)), 0);
  c.typed_value.assign(c.typed_key.size(), 0);
  c.key_scales.assign(static_cast<size_t>(rows), 0);
  c.value_scales.assign(c.key_scales.size(), 0);
  KvLayerView typed{c.typed_key.data(), c.typed_value.data(), v.num_blocks, v.block_size, v.num_kv_heads,
                    v.head_dim, dtype, c.key_scales.data(), c.value_scales.data()};
  for (int64_t slot = 0; slot < v.num_blocks * v.block_size; ++slot) {
    for (int64_t h = 0; h < v.num_kv_heads; ++h) {
      float* k = c.key.data() + (slot * v.num_kv_heads + h) * v.head_dim;
      float* val = c.value.data() + (slot * v.num_kv_heads + h) * v.head_dim;
      write_kv_row(typed, false, slot, h, k);
      write_kv_row(typed, true, slot, h, val);
      read_kv_row(typed, false, slot, h, k);
      read_kv_row(typed, true, slot, h, val);
    }
  }
  v = typed;
}

Cache make_cache(int64_t block_size, int64_t kv_heads, int64_t hd,
                 const std::vector<int64_t>& context_lens, std::mt19937& rng) {
  int64_t blocks = 0;
  for (int64_t c : context_lens) blocks += (c + block_size - 1) / block_size;
  blocks += 3;  // unused blocks in between
  Cache c;
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  c.key.resize(static_cast<size_t>(blocks * block_size * kv_heads * hd));
  c.value.resize(c.key.size());
  for (auto& v : c.key) v = dist(rng);
  for (auto& v : c.value) v = dist(rng);
  c.view = KvLayerView{c.key.data(), c.value.data(), blocks, block_size, kv_heads, hd};
  std::vector<BlockId> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  size_t next = 0;
  for (int64_t len : context_lens) {
    std::vector<BlockId> t;
    for (int64_t b = 0; b < (len + block_size - 1) / block_size; ++b) t.push_back(ids[next++]);
    c.tables.push_back(std::move(t));
  }
  return c;
}

// Float64 attention of one query vector (head h at position pos) over a cache.
std::vector<double> expected(const float* qh, const Cache& c, const std::vector<BlockId>& table,
                             int64_t pos, int64_t kvh, const AttentionParams& p) {
  const int64_t hd = p.head_dim, bs = c.view.block_size;
  const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
  std::vector<double> s;
  for (int64_t t = first; t <= pos; ++t) {
    const int64_t slot = table[static_cast<size_t>(t / bs)] * bs + t % bs;
    const float* k = c.key.data() + (slot * c.view.num_kv_heads + kvh) * hd;
    double dot = 0;
    for (int64_t d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * k[d];
    s.push_back(dot * p.scale);
  }
  const double mx = *std::max_element(s.begin(), s.end());
  double sum = 0;
  for (double& v : s) sum += (v = std::exp(v - mx));
  std::vector<double> o(static_cast<size_t>(hd), 0.0);
  for (int64_t t = first; t <= pos; ++t) {
    const int64_t slot = table[static_cast<size_t>(t / bs)] * bs + t % bs;
    const float* v = c.value.data() + (slot * c.view.num_kv_heads + kvh) * hd;
    for (int64_t d = 0; d < hd; ++d) o[d] += s[static_cast<size_t>(t - first)] / sum * v[d];
  }
  return o;
}

// A Kernels::paged_attention entry with its pool (paged_attention_avx2_pooled, ..._avx512_pooled).
using PooledAttention = void (*)(const float*, const AttentionSeq*, int64_t, const KvLayerView&, const AttentionParams&,
                                 float*, float*, ThreadPool*);

struct Case {
  int64_t heads, kv_heads, hd, block_size, window;
  std::vector<int64_t> context, query;  // per sequence
};

std::string describe(const Case& c) {
  std::string s = "heads=" + std::to_string(c.heads) + "/" + std::to_string(c.kv_heads) +
                  " hd=" + std::to_string(c.hd) + " block=" + std::to_string(c.block_size) +
                  " window=" + std::to_string(c.window) + " seqs";
  for (size_t i = 0; i < c.context.size(); ++i)
    s += " " + std::to_string(c.query[i]) + "/" + std::to_string(c.context[i]);
  return s;
}

void check_case(PooledAttention attention, const Case& cs, ThreadPool* pool, uint32_t seed,
                KvCacheDtype dtype = KvCacheDtype::kF32) {
  std::mt19937 rng(seed);
  Cache c = make_cache(cs.block_size, cs.kv_heads, cs.hd, cs.context, rng);
  convert_cache(c, dtype);
  const AttentionParams p{cs.heads, cs.kv_heads, cs.hd,
                          static_cast<float>(1.0 / std::sqrt(static_cast<double>(cs.hd))), cs.window};
  std::vector<AttentionSeq> seqs;
  int64_t rows = 0;
  for (size_t i = 0; i < cs.context.size(); ++i) {
    seqs.push_back({rows, cs.query[i], cs.context[i], c.tables[i].data()});
    rows += cs.query[i];
  }
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<float> q(static_cast<size_t>(rows * cs.heads * cs.hd));
  for (auto& v : q) v = dist(rng);
  std::vector<float> out(q.size(), NAN);
  attention(q.data(), seqs.data(), static_cast<int64_t>(seqs.size()), c.view, p, out.data(), nullptr, pool);
  int failures = 0;
  for (size_t s = 0; s < seqs.size() && failures < 5; ++s) {
    for (int64_t j = 0; j < seqs[s].num_query; ++j) {
      const int64_t row = seqs[s].query_start + j;
      const int64_t pos = seqs[s].context_len - seqs[s].num_query + j;
      for (int64_t h = 0; h < cs.heads; ++h) {
        const float* qh = q.data() + (row * cs.heads + h) * cs.hd;
        const std::vector<double> want =
            expected(qh, c, c.tables[s], pos, h / (cs.heads / cs.kv_heads), p);
        for (int64_t d = 0; d < cs.hd; ++d) {
          const float got = out[static_cast<size_t>((row * cs.heads + h) * cs.hd + d)];
          // Values are in [-1, 1] and the weights sum to 1: f32 error stays near 1e-6.
          if (!(std::fabs(got - want[static_cast<size_t>(d)]) <= 2e-5)) {
            ADD_FAILURE() << describe(cs) << " " << kv_cache_dtype_name(dtype) << ": seq " << s << " row " << j << " head " << h
                          << " [" << d << "] = " << got << ", want " << want[static_cast<size_t>(d)];
            if (++failures >= 5) return;
          }
        }
      }
    }
  }
}

void matches_float64_attention(PooledAttention attention) {
  const std::vector<Case> cases = {
      {1, 1, 8, 16, 0, {1}, {1}},                  // one key
      {4, 4, 64, 16, 0, {37}, {1}},                // decode, MHA
      {32, 4, 64, 16, 0, {100}, {100}},            // TinyLlama's GQA, whole prefill
      {14, 2, 64, 16, 0, {70, 33}, {20, 1}},       // Qwen2.5-0.5B's group of 7, a chunk + a decode
      {8, 2, 80, 1, 0, {19}, {19}},                // head_dim 80, one-token blocks
      {6, 3, 12, 3, 0, {40}, {17}},                // head_dim with a tail, blocks of 3
      {8, 8, 128, 32, 0, {130, 2, 65}, {1, 2, 65}},// several sequences
      {8, 2, 64, 16, 7, {50}, {50}},               // sliding window inside a tile
      {8, 2, 64, 16, 40, {90, 61}, {30, 1}},       // sliding window over several tiles
      {4, 1, 16, 256, 0, {300}, {45}},             // large blocks, MQA
      {96, 1, 8, 16, 0, {20}, {3}},                // group wider than one tile of heads
      {12, 3, 12, 3, 5, {40, 9}, {17, 9}},         // lanes: head_dim tail, blocks of 3, window 5
      {20, 5, 24, 1, 0, {33}, {1}},                // lanes: decode with 4 of 8 lanes used
      {64, 4, 64, 16, 0, {45, 8}, {45, 3}},        // lanes: a group of 16, full 16 lanes
  };
  uint32_t seed = 1;
  for (const Case& c : cases) check_case(attention, c, nullptr, seed++);
}

// Caches of the other dtypes: the attention over the values they hold (converted to f32 per tile),
// for the one-vector and the lane kernels, prefill and decode, a window, threaded.
void reads_every_cache_dtype(PooledAttention attention) {
  ThreadPool pool(3);
  const std::vector<Case> cases = {
      {4, 2, 64, 16, 0, {37, 5}, {1, 5}},      // group of 2, decode and a prefill
      {32, 4, 64, 16, 0, {100}, {100}},        // lanes, whole prefill
      {8, 2, 36, 3, 9, {40, 18}, {17, 1}},     // head_dim with a tail, blocks of 3, window 9
  };
  uint32_t seed = 300;
  for (KvCacheDtype t : {KvCacheDtype::kF16, KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp8E5M2,
                         KvCacheDtype::kInt8}) {
    for (const Case& c : cases) {
      check_case(attention, c, nullptr, seed, t);
      check_case(attention, c, &pool, seed++, t);
    }
  }
}

void matches_float64_attention_threaded(PooledAttention attention) {
  ThreadPool pool(3);
  check_case(attention, {32, 4, 64, 16, 0, {300, 77, 1}, {300, 1, 1}}, &pool, 50);
  check_case(attention, {16, 16, 64, 8, 0, {64, 64, 64, 64}, {1, 1, 1, 1}}, &pool, 51);
}

// The probe sequence's output rows, computed inside a batch of other sequences (any order),
// alone, chunked in two, with its last row as a decode step, and on several threads: all the
// same bits. For a group of 8 (the lane kernel, full lanes), of 4 with a sliding window and a head
// size with a tail (the lane kernel, half-full lanes in decode), and of 2 (one vector at a time).
void result_does_not_depend_on_batch_chunking_or_threads(PooledAttention attention) {
  struct Shape {
    int64_t heads, kv_heads, hd, window;
  };
  for (const Shape& sh : {Shape{32, 4, 64, 0}, Shape{16, 4, 36, 20}, Shape{8, 4, 64, 0}}) {
    SCOPED_TRACE("heads " + std::to_string(sh.heads) + "/" + std::to_string(sh.kv_heads) +
                 " hd " + std::to_string(sh.hd) + " window " + std::to_string(sh.window));
    std::mt19937 rng(9);
    const int64_t bs = 16, ctx = 97;
    Cache c = make_cache(bs, sh.kv_heads, sh.hd, {ctx, 50, 200}, rng);
    const AttentionParams p{sh.heads, sh.kv_heads, sh.hd, 0.125f, sh.window};
    const int64_t row_floats = sh.heads * sh.hd;
    std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
    std::vector<float> probe_q(static_cast<size_t>(ctx * row_floats));
    for (auto& v : probe_q) v = dist(rng);

    // Alone, whole prefill, calling thread.
    std::vector<float> alone(probe_q.size());
    AttentionSeq whole{0, ctx, ctx, c.tables[0].data()};
    attention(probe_q.data(), &whole, 1, c.view, p, alone.data(), nullptr, nullptr);

    // In chunks of 40, 56 and 1 rows (the last a decode step), 3 threads.
    ThreadPool pool(3);
    std::vector<float> chunked(probe_q.size());
    for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 40}, {40, ctx - 1}, {ctx - 1, ctx}}) {
      AttentionSeq chunk{0, end - begin, end, c.tables[0].data()};
      attention(probe_q.data() + begin * row_floats, &chunk, 1, c.view, p, chunked.data() + begin * row_floats, nullptr,
                &pool);
    }
    EXPECT_EQ(alone, chunked);

    // Last in a batch after two other sequences (a decode and a prefill chunk), 2 threads.
    std::vector<float> batch_q(static_cast<size_t>((1 + 30) * row_floats), 0.5f);
    batch_q.insert(batch_q.end(), probe_q.begin(), probe_q.end());
    std::vector<AttentionSeq> seqs = {{0, 1, 50, c.tables[1].data()},
                                      {1, 30, 200, c.tables[2].data()},
                                      {31, ctx, ctx, c.tables[0].data()}};
    std::vector<float> batch_out(batch_q.size());
    ThreadPool two(2);
    attention(batch_q.data(), seqs.data(), 3, c.view, p, batch_out.data(), nullptr, &two);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), batch_out.begin() + 31 * row_floats));
  }
}

PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx2, MatchesFloat64Attention, "avx2", "paged_attention") {
  matches_float64_attention(paged_attention_avx2_pooled);
}
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx2, ReadsEveryCacheDtype, "avx2", "paged_attention") {
  reads_every_cache_dtype(paged_attention_avx2_pooled);
}
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx2, MatchesFloat64AttentionThreaded, "avx2", "paged_attention") {
  matches_float64_attention_threaded(paged_attention_avx2_pooled);
}
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx2, ResultDoesNotDependOnBatchChunkingOrThreads, "avx2", "paged_attention") {
  result_does_not_depend_on_batch_chunking_or_threads(paged_attention_avx2_pooled);
}

// The avx512 table's entry (the avx512vnni and avx512bf16 tables install the same one).
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx512, MatchesFloat64Attention, "avx512", "paged_attention") {
  matches_float64_attention(paged_attention_avx512_pooled);
}
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx512, ReadsEveryCacheDtype, "avx512", "paged_attention") {
  reads_every_cache_dtype(paged_attention_avx512_pooled);
}
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx512, MatchesFloat64AttentionThreaded, "avx512", "paged_attention") {
  matches_float64_attention_threaded(paged_attention_avx512_pooled);
}
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx512, ResultDoesNotDependOnBatchChunkingOrThreads, "avx512",
                         "paged_attention") {
  result_does_not_depend_on_batch_chunking_or_threads(paged_attention_avx512_pooled);
}

// 16 lanes give the 8-lane kernel's bits: each lane runs the same operations (attention_lanes.h).
// Groups of 4, 8 and 16 query heads (lanes a quarter, half and all full in decode), prefill
// chunks, a window, head sizes with tails, every cache dtype, threaded.
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx512, SameBitsAsTheAvx2Kernel, "avx512", "paged_attention") {
  struct Shape {
    int64_t heads, kv_heads, hd, window;
  };
  uint32_t seed = 700;
  ThreadPool pool(3);
  for (const Shape& sh : {Shape{32, 4, 64, 0}, Shape{16, 4, 36, 20}, Shape{64, 4, 64, 0}, Shape{8, 2, 13, 0}}) {
    for (KvCacheDtype dtype : {KvCacheDtype::kF32, KvCacheDtype::kF16, KvCacheDtype::kInt8}) {
      SCOPED_TRACE("heads " + std::to_string(sh.heads) + "/" + std::to_string(sh.kv_heads) + " hd " +
                   std::to_string(sh.hd) + " window " + std::to_string(sh.window) + " " + std::string(kv_cache_dtype_name(dtype)));
      std::mt19937 rng(seed++);
      Cache c = make_cache(16, sh.kv_heads, sh.hd, {130, 41, 1}, rng);
      convert_cache(c, dtype);
      const AttentionParams p{sh.heads, sh.kv_heads, sh.hd, 0.125f, sh.window};
      const std::vector<AttentionSeq> seqs = {
          {0, 130, 130, c.tables[0].data()}, {130, 1, 41, c.tables[1].data()}, {131, 1, 1, c.tables[2].data()}};
      std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
      std::vector<float> q(static_cast<size_t>(132 * sh.heads * sh.hd));
      for (auto& v : q) v = dist(rng);
      std::vector<float> avx2(q.size(), NAN), avx512(q.size(), NAN);
      paged_attention_avx2_pooled(q.data(), seqs.data(), 3, c.view, p, avx2.data(), nullptr, nullptr);
      paged_attention_avx512_pooled(q.data(), seqs.data(), 3, c.view, p, avx512.data(), nullptr, &pool);
      int64_t differ = 0;
      for (size_t i = 0; i < q.size(); ++i) differ += std::memcmp(&avx2[i], &avx512[i], sizeof(float)) != 0;
      EXPECT_EQ(differ, 0) << "of " << q.size() << " outputs";
    }
  }
}

// kv_rows_to_f32_avx2 reads what read_kv_row reads: every fp8 code, every fp16 and bf16 bit
// pattern, int8 rows with their scales; head sizes with a tail; positions across scattered
// blocks. A NaN must stay a NaN (its payload is not part of the contract).
PAGODA_KERNEL_TABLE_TEST(KvRowsToF32Avx2, ReadsWhatReadKvRowReads, "avx2", "paged_attention") {
  std::mt19937 rng(77);
  for (KvCacheDtype dtype : {KvCacheDtype::kF16, KvCacheDtype::kBF16, KvCacheDtype::kFp8E4M3, KvCacheDtype::kFp8E5M2,
                             KvCacheDtype::kInt8}) {
    for (int64_t hd : {int64_t{64}, int64_t{36}, int64_t{5}}) {
      SCOPED_TRACE(std::string(kv_cache_dtype_name(dtype)) + " head_dim " + std::to_string(hd));
      const int64_t block_size = 16, kv_heads = 2, elem = kv_cache_elem_bytes(dtype);
      const int64_t patterns = elem == 2 ? 65536 : 256;
      // Every bit pattern at least once, in the rows of kv head 1 of one sequence's positions.
      const int64_t positions = (patterns + hd - 1) / hd + 3;
      const int64_t blocks = (positions + block_size - 1) / block_size + 2;
      std::vector<uint8_t> keys(static_cast<size_t>(blocks * block_size * kv_heads * hd * elem));
      std::vector<float> scales(static_cast<size_t>(blocks * block_size * kv_heads));
      for (size_t i = 0; i < keys.size(); i += static_cast<size_t>(elem)) {
        const auto code = static_cast<uint32_t>((i / static_cast<size_t>(elem)) % static_cast<size_t>(patterns));
        std::memcpy(keys.data() + i, &code, static_cast<size_t>(elem));  // little-endian low bytes
      }
      std::uniform_real_distribution<float> scale(0.001f, 3.0f);
      for (auto& v : scales) v = scale(rng);
      const KvLayerView view{keys.data(), keys.data(), blocks, block_size, kv_heads, hd, dtype, scales.data(),
                             scales.data()};
      std::vector<BlockId> table(static_cast<size_t>(blocks));
      std::iota(table.begin(), table.end(), 0);
      std::shuffle(table.begin(), table.end(), rng);
      static constexpr KvRowFormat kFormats[] = {KvRowFormat::kF16, KvRowFormat::kF16, KvRowFormat::kBF16,
                                                 KvRowFormat::kFp8E4M3, KvRowFormat::kFp8E5M2, KvRowFormat::kInt8};
      const KvRowSource source{kFormats[static_cast<int>(dtype)], keys.data(), scales.data(), kv_heads, hd, block_size, 1,
                               table.data()};
      // fp8 again with denormals-are-zero set, as a host process may leave it (the subnormal codes
      // must not go through float arithmetic on subnormal inputs).
      const bool fp8 = dtype == KvCacheDtype::kFp8E4M3 || dtype == KvCacheDtype::kFp8E5M2;
      for (auto [first, count, daz] : {std::tuple<int64_t, int64_t, bool>{0, positions, false}, {13, 7, false},
                                       {17, 1, false}, {0, positions, fp8}}) {
        std::vector<float> got(static_cast<size_t>(count * hd), -1.0f), want(got.size());
        const unsigned int csr = _mm_getcsr();
        if (daz) _mm_setcsr(csr | 0x0040);
        kv_rows_to_f32_avx2(source, first, count, got.data());
        _mm_setcsr(csr);
        for (int64_t t = 0; t < count; ++t) {
          const int64_t pos = first + t;
          const int64_t slot = table[static_cast<size_t>(pos / block_size)] * block_size + pos % block_size;
          read_kv_row(view, false, slot, 1, want.data() + t * hd);
        }
        int64_t differ = 0;
        for (size_t i = 0; i < got.size(); ++i) {
          const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
          differ += !both_nan && std::memcmp(&got[i], &want[i], sizeof(float)) != 0;
        }
        EXPECT_EQ(differ, 0) << "positions " << first << " + " << count << (daz ? ", denormals are zero" : "");
      }
    }
  }
}

// Long prompts: one sequence of 8,192 and of 32,768 tokens (scattered blocks), a kv head group
// of 8 (the lane kernels) and of 2 (one vector at a time), f32 and fp8 caches. Query rows around
// position 30,000 (8,000 at 8k) and the last ones, computed as one prefill chunk, as chunks of
// other sizes and as decode steps: the same bits every way, and within 2e-5 of the float64
// attention. At position 30,000 sits a needle: its key is the probe query's own direction, so
// the query after it must attend to it as the reference does (its output is that row's value).
void long_prompt_attention(PooledAttention attention) {
  ThreadPool pool(2);
  for (int64_t ctx : {int64_t{8192}, int64_t{32768}}) {
    for (auto [heads, kv_heads] : {std::pair<int64_t, int64_t>{8, 1}, {4, 2}}) {
      for (KvCacheDtype dtype : {KvCacheDtype::kF32, KvCacheDtype::kFp8E4M3}) {
        SCOPED_TRACE("context " + std::to_string(ctx) + " heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) +
                     " " + std::string(kv_cache_dtype_name(dtype)));
        const int64_t hd = 64, bs = 16;
        const int64_t needle = ctx > 30000 ? 30000 : 8000;
        std::mt19937 rng(static_cast<uint32_t>(ctx + heads));
        Cache c = make_cache(bs, kv_heads, hd, {ctx}, rng);
        // Small random keys, so that no key but the needle stands out; the needle's key is a unit
        // direction, scaled up.
        std::vector<float> direction(static_cast<size_t>(hd));
        std::normal_distribution<float> normal(0.0f, 1.0f);
        double norm = 0;
        for (auto& v : direction) {
          v = normal(rng);
          norm += static_cast<double>(v) * v;
        }
        for (auto& v : direction) v = static_cast<float>(v / std::sqrt(norm));
        for (auto& v : c.key) v *= 0.25f;
        const auto& table = c.tables[0];
        for (int64_t h = 0; h < kv_heads; ++h) {
          const int64_t slot = table[static_cast<size_t>(needle / bs)] * bs + needle % bs;
          float* k = c.key.data() + (slot * kv_heads + h) * hd;
          for (int64_t d = 0; d < hd; ++d) k[d] = 16.0f * direction[static_cast<size_t>(d)];
        }
        convert_cache(c, dtype);
        const AttentionParams p{heads, kv_heads, hd, 0.125f, 0};
        const int64_t row_floats = heads * hd;
        // Rows [needle - 20, needle + 20) and [ctx - 4, ctx): the probe rows. 40 rows are several
        // tiles of rows in both shapes, so a non-f32 cache is converted once for the chunk there
        // (and per tile in the decode steps).
        const std::vector<std::pair<int64_t, int64_t>> spans = {{needle - 20, needle + 20}, {ctx - 4, ctx}};
        std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
        for (auto [begin, end] : spans) {
          std::vector<float> q(static_cast<size_t>((end - begin) * row_floats));
          for (auto& v : q) v = dist(rng);
          // Every head of the row after the needle asks for the needle's direction.
          if (begin <= needle + 1 && needle + 1 < end) {
            for (int64_t h = 0; h < heads; ++h) {
              float* qh = q.data() + ((needle + 1 - begin) * heads + h) * hd;
              for (int64_t d = 0; d < hd; ++d) qh[d] = 16.0f * direction[static_cast<size_t>(d)];
            }
          }
          // One chunk of the span.
          std::vector<float> whole(q.size(), NAN);
          AttentionSeq seq{0, end - begin, end, table.data()};
          attention(q.data(), &seq, 1, c.view, p, whole.data(), nullptr, &pool);
          // Chunks of 3 and the rest, on the calling thread; then each row as a decode step.
          std::vector<float> split(q.size(), NAN), steps(q.size(), NAN);
          for (auto [b, e] : {std::pair<int64_t, int64_t>{begin, begin + 3}, {begin + 3, end}}) {
            AttentionSeq part{0, e - b, e, table.data()};
            attention(q.data() + (b - begin) * row_floats, &part, 1, c.view, p, split.data() + (b - begin) * row_floats, nullptr, nullptr);
          }
          for (int64_t r = begin; r < end; ++r) {
            AttentionSeq one{0, 1, r + 1, table.data()};
            attention(q.data() + (r - begin) * row_floats, &one, 1, c.view, p, steps.data() + (r - begin) * row_floats, nullptr, &pool);
          }
          EXPECT_EQ(0, std::memcmp(whole.data(), split.data(), whole.size() * sizeof(float))) << "rows " << begin << "..";
          EXPECT_EQ(0, std::memcmp(whole.data(), steps.data(), whole.size() * sizeof(float))) << "rows " << begin << "..";
          double worst = 0;
          for (int64_t r = begin; r < end; ++r) {
            // Against float64 for every fifth row, the row after the needle and the last.
            if ((r - begin) % 5 != 0 && r != needle + 1 && r != end - 1) continue;
            for (int64_t h = 0; h < heads; ++h) {
              const float* qh = q.data() + ((r - begin) * heads + h) * hd;
              const std::vector<double> want = expected(qh, c, table, r, h / (heads / kv_heads), p);
              const float* got = whole.data() + ((r - begin) * heads + h) * hd;
              for (int64_t d = 0; d < hd; ++d) worst = std::max(worst, std::fabs(got[d] - want[static_cast<size_t>(d)]));
              if (r == needle + 1) {  // the needle's value row, as the reference and the kernel see it
                const int64_t slot = table[static_cast<size_t>(needle / bs)] * bs + needle % bs;
                const float* v = c.value.data() + (slot * kv_heads + h / (heads / kv_heads)) * hd;
                for (int64_t d = 0; d < hd; ++d) {
                  EXPECT_NEAR(want[static_cast<size_t>(d)], v[d], 0.05) << "the reference misses the needle";
                  EXPECT_NEAR(got[d], v[d], 0.05) << "head " << h << " element " << d;
                }
              }
            }
          }
          EXPECT_LT(worst, 2e-5) << "rows " << begin << "..";
        }
      }
    }
  }
}

// Context parallelism's arithmetic: a context's keys dealt to `parts` caches by position (t to
// part t % parts, as local position t / parts), each part's attention with its log-sum-exp, and
// merge_attention of the parts equal the attention over the whole context. A query at position p
// reads in part r the local positions up to (p - r) / parts, so the queries of one residue class
// (p % parts) make one ordinary causal sequence there; a query with none of a part's keys leaves
// that part's row at -inf and weighs nothing.
void parts_merge_to_the_whole(PooledAttention attention) {
  const KernelTable& reference = reference_kernels();
  for (int64_t parts : {int64_t{2}, int64_t{3}, int64_t{4}}) {
    for (auto [heads, kv_heads, hd] : {std::tuple<int64_t, int64_t, int64_t>{32, 4, 64}, {4, 2, 36}}) {
      SCOPED_TRACE("parts " + std::to_string(parts) + " heads " + std::to_string(heads) + "/" + std::to_string(kv_heads));
      const int64_t ctx = 150, num_query = 23, bs = 16;  // the last 23 positions: a prefill chunk
      std::mt19937 rng(static_cast<uint32_t>(parts * 100 + heads));
      Cache whole = make_cache(bs, kv_heads, hd, {ctx}, rng);
      const AttentionParams p{heads, kv_heads, hd, 0.125f, 0};
      const int64_t row_floats = heads * hd;
      std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
      std::vector<float> q(static_cast<size_t>(num_query * row_floats));
      for (auto& v : q) v = dist(rng);
      const int64_t first = ctx - num_query;
      std::vector<float> outs(static_cast<size_t>(parts * num_query * row_floats), 0.0f);
      std::vector<float> lses(static_cast<size_t>(parts * num_query * heads), -INFINITY);
      for (int64_t r = 0; r < parts; ++r) {
        // Part r's cache: its positions in order, blocks in order.
        const int64_t local_len = (ctx - r + parts - 1) / parts;
        const int64_t blocks = (local_len + bs - 1) / bs;
        std::vector<float> key(static_cast<size_t>(blocks * bs * kv_heads * hd)), value(key.size());
        for (int64_t j = 0; j < local_len; ++j) {
          const int64_t t = j * parts + r;
          const int64_t slot = whole.tables[0][static_cast<size_t>(t / bs)] * bs + t % bs;
          std::copy_n(whole.key.data() + slot * kv_heads * hd, kv_heads * hd, key.data() + j * kv_heads * hd);
          std::copy_n(whole.value.data() + slot * kv_heads * hd, kv_heads * hd, value.data() + j * kv_heads * hd);
        }
        std::vector<BlockId> table(static_cast<size_t>(blocks));
        std::iota(table.begin(), table.end(), 0);
        const KvLayerView local{key.data(), value.data(), blocks, bs, kv_heads, hd};
        // The queries of each residue class, in order, as one sequence each.
        std::vector<float> class_q, class_out, class_lse;
        std::vector<int64_t> row_of;  // class-ordered row -> chunk row
        std::vector<AttentionSeq> seqs;
        for (int64_t cls = 0; cls < parts; ++cls) {
          const auto start = static_cast<int64_t>(row_of.size());
          int64_t last_limit = -1;
          for (int64_t row = 0; row < num_query; ++row) {
            const int64_t pos = first + row;
            if (pos % parts != cls || pos < r) continue;  // another class, or no key of part r
            row_of.push_back(row);
            class_q.insert(class_q.end(), q.begin() + row * row_floats, q.begin() + (row + 1) * row_floats);
            last_limit = (pos - r) / parts;
          }
          const int64_t count = static_cast<int64_t>(row_of.size()) - start;
          if (count > 0) seqs.push_back({start, count, last_limit + 1, table.data()});
        }
        class_out.assign(class_q.size(), NAN);
        class_lse.assign(row_of.size() * static_cast<size_t>(heads), NAN);
        ThreadPool pool(2);
        attention(class_q.data(), seqs.data(), static_cast<int64_t>(seqs.size()), local, p, class_out.data(),
                  class_lse.data(), r % 2 == 0 ? &pool : nullptr);
        for (size_t i = 0; i < row_of.size(); ++i) {
          const int64_t row = row_of[i];
          std::copy_n(class_out.data() + i * row_floats, row_floats, outs.data() + (r * num_query + row) * row_floats);
          std::copy_n(class_lse.data() + i * heads, heads, lses.data() + (r * num_query + row) * heads);
        }
      }
      std::vector<float> merged(q.size(), NAN);
      reference.merge_attention(testing_context(), outs.data(), lses.data(), parts, num_query, heads, hd, merged.data());
      double worst = 0;
      for (int64_t row = 0; row < num_query; ++row) {
        for (int64_t h = 0; h < heads; ++h) {
          const std::vector<double> want =
              expected(q.data() + (row * heads + h) * hd, whole, whole.tables[0], first + row, h / (heads / kv_heads), p);
          for (int64_t d = 0; d < hd; ++d)
            worst = std::max(worst, std::fabs(merged[static_cast<size_t>((row * heads + h) * hd + d)] - want[static_cast<size_t>(d)]));
        }
      }
      EXPECT_LT(worst, 2e-5);
    }
  }
}

void reference_attention(const float* q, const AttentionSeq* seqs, int64_t num_seqs, const KvLayerView& cache,
                         const AttentionParams& p, float* out, float* lse, ThreadPool*) {
  reference_kernels().paged_attention(testing_context(), q, seqs, num_seqs, cache, p, out, lse);
}

TEST(PagedAttentionReference, PartsMergeToTheWhole) { parts_merge_to_the_whole(reference_attention); }
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx2, PartsMergeToTheWhole, "avx2", "paged_attention") {
  parts_merge_to_the_whole(paged_attention_avx2_pooled);
}
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx512, PartsMergeToTheWhole, "avx512", "paged_attention") {
  parts_merge_to_the_whole(paged_attention_avx512_pooled);
}

PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx2, LongPromptsAt8kAnd32k, "avx2", "paged_attention") {
  long_prompt_attention(paged_attention_avx2_pooled);
}
PAGODA_KERNEL_TABLE_TEST(PagedAttentionAvx512, LongPromptsAt8kAnd32k, "avx512", "paged_attention") {
  long_prompt_attention(paged_attention_avx512_pooled);
}

}  // namespace
}  // namespace pagoda::cpu
