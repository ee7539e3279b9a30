// The x86 SIMD kernels of the CPU backend. Each is checked against the reference kernels
// (kernels/reference) and chosen at start-up from cpu_features(); calling one on a CPU without
// its features is a bug (SIGILL). Stateless apart from the thread pool they are handed:
// thread-safe.
//
// Layout of the AVX2 kernels: matmul_avx2.cpp and attention_avx2.cpp hold only the leaf loops and
// are the files compiled with -mavx2 -mfma (-mf16c). They deliberately use no inline function or
// template from a shared header (no Tensor, std::vector, std::function, tensor/half.h, <cmath>):
// the out-of-line copy such a file emits would carry AVX2 instructions, and the linker may keep
// that copy for the whole program, which must run on CPUs without AVX2. The threading drivers
// (*_driver.cpp) are baseline code.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace pagoda {
struct BlockQ8Act;
struct Tensor;
class ThreadPool;
struct AttentionSeq;
struct AttentionParams;
struct KvLayerView;
}  // namespace pagoda

namespace pagoda::cpu {

// AVX2 + FMA + F16C. Computes y[i, j] = sum_t x[i, t] * w[j, t] for every i < m and every
// j in [row_begin, row_end): x is [m, k] f32; w is row j at w + j * w_row_bytes, k elements of
// w_type (f32, f16 or bf16); y is [m, ldy] f32. Runs on the calling thread.
void matmul_rows_avx2(const float* x, int64_t m, int64_t k, DType w_type, const void* w,
                      int64_t w_row_bytes, float* y, int64_t ldy, int64_t row_begin,
                      int64_t row_end);

// AVX2. Quantizes the m rows of x ([m, k] f32, k % 32 == 0) to m * k / 32 BlockQ8Act, bit for
// bit as quantize_activation_row does.
void quantize_activation_rows_avx2(const float* x, int64_t m, int64_t k, BlockQ8Act* out);

// AVX2 + F16C. The same product for q8_0 / q4_0 weights (k % 32 == 0) against activations
// quantized by quantize_activation_rows_avx2 (row i at x + i * k / 32): int8 dot products per
// block, as the reference kernel defines them.
void matmul_q8act_rows_avx2(const BlockQ8Act* x, int64_t m, int64_t k, DType w_type, const void* w,
                            int64_t w_row_bytes, float* y, int64_t ldy, int64_t row_begin,
                            int64_t row_end);

// y[m, n] = x[m, k] * w[n, k]^T (the Kernels::matmul contract) with matmul_rows_avx2, the rows
// of w split over `pool` in chunks (pool == nullptr, or a small product: the calling thread only).
void matmul_avx2_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool);

// The Kernels::matmul entry: matmul_avx2_pooled over cpu_thread_pool().
void matmul_avx2(const float* x, int64_t m, const Tensor& w, float* y);

// One unit of paged-attention work for attention_tile_avx2: query rows [first row, + num_rows) of
// one sequence (consecutive positions first_pos, first_pos + 1, ...), and the num_group_heads
// query heads that read one kv head. Plain data, filled by the driver; every field is set.
struct AttentionTile {
  const float* q;        // query row 0, first head of the group; row r at q + r * row_stride
  float* out;            // same layout as q
  int64_t row_stride;    // floats between query rows (num_heads * head_dim)
  int64_t num_rows;
  int64_t num_group_heads;
  int64_t head_dim;
  int64_t first_pos;     // position of row 0
  const float* key;      // the cache's keys, already offset to this kv head
  const float* value;    // likewise for values
  int64_t kv_slot_stride;  // floats between cache slots (num_kv_heads * head_dim)
  const int32_t* block_table;
  int64_t block_size;
  float scale;
  int64_t sliding_window;  // 0 = full causal
  float* scratch;          // 2 * num_rows * num_group_heads floats
};

// AVX2 + FMA. Causal softmax attention of the tile's query vectors over their sequence's cache
// (keys at positions <= their own, within the sliding window). Runs on the calling thread.
void attention_tile_avx2(const AttentionTile& tile);

// The Kernels::paged_attention entry: the work split into AttentionTiles (per sequence, kv head
// and group of query rows) over `pool` (nullptr: the calling thread only).
void paged_attention_avx2_pooled(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                                 const KvLayerView& cache, const AttentionParams& params,
                                 float* out, ThreadPool* pool);
void paged_attention_avx2(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                          const KvLayerView& cache, const AttentionParams& params, float* out);

// AVX2 + FMA element-wise leaves, on the calling thread, with the Kernels contracts of rms_norm,
// silu_mul (over [0, n)) and add. Each element's value does not depend on n or its place in the
// buffer. The *_avx2 entries without a suffix split large calls over cpu_thread_pool().
void rms_norm_rows_avx2(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* y);
void silu_mul_range_avx2(const float* gate, const float* up, int64_t n, float* out);
void add_range_avx2(float* y, const float* x, int64_t n);
void rms_norm_avx2(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* y);
void silu_mul_avx2(const float* gate, const float* up, int64_t n, float* out);
void add_avx2(float* y, const float* x, int64_t n);

}  // namespace pagoda::cpu
