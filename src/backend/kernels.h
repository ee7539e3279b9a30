// The seam between the model (which knows the math of an architecture) and a backend (which
// knows a device: its memory and how to do each op fast on it).
//
// KernelTable: the backend's compute operations, each taking the ExecContext it runs in (the CPU
// backend's thread pool; an accelerator's stream). Every entry has a scalar reference in
// backend/cpu/scalar; fast variants must match it. Kernels: a table bound to its context, what the
// model calls (k.matmul(x, m, w, y)).
//
// Memory: activations, weights, the KV cache and the workspace are device memory, allocated
// through the context (ExecContext::allocate); code above the backend holds pointers to it but
// never reads or writes what they point to: it moves data with the copy entries and computes
// with the others. Small index arrays that describe the work (token ids, positions, slot
// mappings, block tables, row lists, matmul groups) are host memory, as kernel arguments are.
// Activations are f32; weight matrices stay in their stored DType (in a backend's packed layout
// where the table has pack_matmul_weight) and the kernel converts on the fly. Tables are
// immutable and contexts thread-compatible: one engine thread calls a context's kernels.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>

#include "base/status.h"
#include "base/types.h"
#include "comm/communicator.h"
#include "tensor/kv_cache_dtype.h"
#include "tensor/tensor.h"

namespace pagoda {

// Where a backend's kernels run: its stream, its threads. A backend derives its own context and its
// entries cast back to it (a table is only ever called with its backend's context).
class ExecContext {
 public:
  virtual ~ExecContext() = default;
  // `bytes` of device memory, zero-filled; the Buffer frees it. Throws std::bad_alloc when the
  // device has none left.
  virtual Buffer allocate(size_t bytes) const = 0;
};

// The paged KV cache of one layer, as the backend lays it out: key and value caches of shape
// [num_blocks, block_size, num_kv_heads, head_dim] of `dtype`. Token slot s lives at block
// s/block_size, offset s%block_size.
struct KvLayerView {
  void* key = nullptr;
  void* value = nullptr;
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  KvCacheDtype dtype = KvCacheDtype::kF32;
  // int8 only: the scale of each (slot, kv head) row, [num_blocks, block_size, num_kv_heads] f32.
  float* key_scales = nullptr;
  float* value_scales = nullptr;
};

// One sequence's slice of a flat batch for attention.
struct AttentionSeq {
  int64_t query_start = 0;   // first row of this sequence in q / out
  int64_t num_query = 0;     // rows of this sequence (new tokens this step)
  int64_t context_len = 0;   // tokens in the cache after this step (computed + new)
  const BlockId* block_table = nullptr;  // ceil(context_len / block_size) block ids
};

struct AttentionParams {
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  float scale = 1.0f;           // usually 1/sqrt(head_dim)
  int64_t sliding_window = 0;   // 0 = full causal attention; else keys in (pos - window, pos]
};

// A weight matrix [n, k] of integer codes with f32 scales per group of columns, for the schemes
// that also quantize activations to int8: W8A8 (int8, one scale per output channel) and W4A8
// (int4 in groups), as vllm-ascend and compressed-tensors' int-quantized checkpoints store them.
// Element (j, t) is scales[j * (k / group_size) + t / group_size] * code(j, t). Borrowed views.
struct IntWeight {
  // Row-major: bits 8: [n, k] int8; bits 4: [n, k / 2] bytes, element 2u of a row in the low
  // nibble of its byte u and 2u + 1 in the high one, each a two's-complement int4 in [-8, 7].
  // Or a backend's packed layout (layout kBackendPacked, from Kernels::pack_int_weight).
  const void* codes = nullptr;
  TensorLayout layout = TensorLayout::kRowMajor;
  int bits = 8;
  int64_t n = 0, k = 0;
  int64_t group_size = 0;         // divides k (k: per output channel); a multiple of 8 below k
  const float* scales = nullptr;  // [n, k / group_size]
  // Optional (nullptr: all 0): the code each group's zero sits at, [n, k / group_size] (AWQ,
  // GPTQ and other asymmetric schemes: the weight is scale * (code - zero)).
  const int32_t* zero_points = nullptr;
  // The activations' scale: 0 = per token (s = max|x_i| / 127, computed per row); > 0 = this
  // static per-tensor scale from calibration.
  float input_scale = 0;

  int64_t groups() const { return group_size > 0 ? k / group_size : 0; }
  int64_t row_code_bytes() const { return bits == 8 ? k : k / 2; }
};

// One product of Kernels::matmul_grouped: rows [row, row + m) of the call's input times w^T into
// y ([m, w->num_rows()]).
struct MatmulGroup {
  int64_t row = 0;
  int64_t m = 0;
  const Tensor* w = nullptr;
  float* y = nullptr;
};

struct KernelTable {
  // y[m, n] = sum_k x[m, k] * w[n, k].  x: [m, k] f32; w: [n, k] any DType the traits mark
  // dense_matmul (every one but i8, whose codes go through matmul_int); y: [m, n] f32.
  // For quantized weights x is first quantized per 32-element block (BlockQ8Act,
  // tensor/quant_blocks.h) and each block's product is computed in exact integers and scaled as
  // QuantChunk defines. Each output's summation order must not depend on m (batch invariance).
  void (*matmul)(const ExecContext& ctx, const float* x, int64_t m, const Tensor& w, float* y);

  // Optional (nullptr: matmul reads weights as upload() leaves them, row-major). Rearranges a
  // row-major matmul weight [n, k] (host memory: the loader's) into the layout this table's
  // matmul reads, in device memory it allocates into *storage; returns the view to hand matmul
  // from then on (same dtype and shape, layout kBackendPacked). Where it is set, matmul takes only
  // weights it returned. Products are those of the row-major weight. Called at load.
  Tensor (*pack_matmul_weight)(const ExecContext& ctx, const Tensor& w, Buffer* storage);

  // Optional (nullptr: one matmul per weight). Several products of one input, y[i] = x w[i]^T for
  // i < count, each bit for bit what matmul(x, m, *w[i], y[i]) writes, as one parallel step: the
  // input converted once and one wait for the workers instead of count (q/k/v, gate/up). The
  // weights share dtype, row length and layout.
  void (*matmul_many)(const ExecContext& ctx, const float* x, int64_t m, const Tensor* const* w, float* const* y, int count) = nullptr;

  // Optional (nullptr: one matmul per group). Products of different rows of one input with
  // different weights, as a mixture of experts runs each active expert over its tokens: for each
  // group g, g.y = x[g.row, g.row + g.m) g.w^T, each bit for bit what matmul(x + g.row * k, g.m,
  // *g.w, g.y) writes, as one parallel step (the input converted once, the work split by cost
  // across the pool, one wait). x: [rows, k] f32, every row some group's; the weights share dtype,
  // row length k and layout. Groups with m == 0 are skipped.
  void (*matmul_grouped)(const ExecContext& ctx, const float* x, const MatmulGroup* groups, int count) = nullptr;

  // y[i, j] = sum_t x[i, t] * w(j, t) with x's rows quantized to int8 first. Row i: s_i =
  // w.input_scale, or max_t |x[i, t]| / 127 per token; xq[i, t] = x[i, t] * (1 / s_i) (127 /
  // max|x_i| per token) rounded to nearest even and saturated to [-127, 127] (an all-zero row stays
  // zero). Then y[i, j] = sum over groups g, in order, from 0, of
  // float(sum_{t in g} xq[i, t] * code(j, t) - zero(j, g) * sum_{t in g} xq[i, t]) *
  // (scale(j, g) * s_i): exact int32 dots (the whole bracket fits int32: |code - zero| <= 256,
  // and callers keep group_size <= 65536), one multiply and one add per group, so a row's
  // result never depends on m. x: [m, k] f32; y: [m, n] f32.
  void (*matmul_int)(const ExecContext& ctx, const float* x, int64_t m, const IntWeight& w, float* y);

  // As pack_matmul_weight, for IntWeight (host memory): the codes, scales and zero points copied
  // into device memory it allocates into *storage, rearranged where the table's matmul_int has a
  // layout of its own (the returned view points there; the originals may be freed).
  IntWeight (*pack_int_weight)(const ExecContext& ctx, const IntWeight& w, Buffer* storage);

  // out[i, :] = row ids[i] - first_row of table, converted to f32, where that is one of its rows;
  // zeros otherwise (a tensor-parallel rank's slice of the vocabulary, first_row its first id).
  // table: [rows, dim] any DType (rows may be 0); ids: host.
  void (*embedding)(const ExecContext& ctx, const Tensor& table, const TokenId* ids, int64_t n, int64_t first_row,
                    float* out);

  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight.  x, y: [rows, dim]; weight: [dim] f32.
  // y may alias x.
  void (*rms_norm)(const ExecContext& ctx, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* y);

  // Rotary embedding in place on x: [num_tokens, num_heads, head_dim] f32. Token t is rotated by
  // angle positions[t] * inv_freq[i] for pair i (head_dim/2 pairs). interleaved: pairs are
  // (2i, 2i+1); otherwise (i, i + head_dim/2) ("rotate half").
  void (*rope)(const ExecContext& ctx, float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq, bool interleaved);

  // out[i] = silu(gate[i]) * up[i] for n elements; out may alias gate.
  void (*silu_mul)(const ExecContext& ctx, const float* gate, const float* up, int64_t n, float* out);

  // y[i] += x[i] for n elements.
  void (*add)(const ExecContext& ctx, float* y, const float* x, int64_t n);

  // Stores k, v: [num_tokens, num_kv_heads, head_dim] f32 into the cache at slot_mapping[t],
  // converted to the cache's dtype (rounded to nearest even; fp8 saturates; int8 sets the row's
  // scale).
  void (*store_kv)(const ExecContext& ctx, const float* k, const float* v, const int64_t* slot_mapping, int64_t num_tokens,
                   const KvLayerView& cache);

  // Causal attention of each sequence's queries over its cached keys/values, read as the f32
  // values of the cache's dtype (GQA: query head h reads kv head h / (num_heads / num_kv_heads)). Query row j of a sequence sits at position
  // context_len - num_query + j. q, out: [num_tokens, num_heads, head_dim] f32.
  // lse (nullptr: not wanted): [num_tokens, num_heads], each query vector's log-sum-exp of its
  // scaled scores (the maximum plus the log of the softmax's denominator), which is what
  // merge_attention needs to combine attention over parts of a context (context parallelism).
  // Rows that no sequence names are left as they are, in out and lse.
  void (*paged_attention)(const ExecContext& ctx, const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                          const KvLayerView& cache, const AttentionParams& params, float* out, float* lse);

  // The attention over a whole context from its parts' (paged_attention's out and lse over each
  // part of the keys): for each of rows x heads vectors, out = sum over parts p of w_p out_p /
  // sum of w_p with w_p = exp(lse_p - max lse), the parts in order. A part whose lse is -inf
  // (no keys) weighs 0; a vector no part has keys for is 0. outs: [parts][rows][heads][head_dim],
  // lses: [parts][rows][heads].
  void (*merge_attention)(const ExecContext& ctx, const float* outs, const float* lses, int64_t parts, int64_t rows,
                          int64_t heads, int64_t head_dim, float* out);

  // ---- Moving data: how code above the backend reaches device memory ----

  // `bytes` from host memory into device memory, and back; zeroes device memory.
  void (*copy_to_device)(const ExecContext& ctx, void* dst, const void* host_src, size_t bytes);
  void (*copy_to_host)(const ExecContext& ctx, void* host_dst, const void* src, size_t bytes);
  void (*zero)(const ExecContext& ctx, void* dst, size_t bytes);

  // A weight, norm or bias as this device holds it: `w` (host memory: a file's mapping or the
  // loader's buffer) copied into device memory allocated into *storage; or, on a device whose
  // memory the host's is (the CPU), `w` itself, read in place.
  Tensor (*upload)(const ExecContext& ctx, const Tensor& w, Buffer* storage);

  // dst[i, 0:width) = src[i, 0:width) for i < rows, the rows dst_stride and src_stride floats apart.
  void (*copy_rows)(const ExecContext& ctx, float* dst, int64_t dst_stride, const float* src, int64_t src_stride,
                    int64_t rows, int64_t width);
  // dst[i, :] = src[rows[i], :] for i < n.  src: [*, dim] f32; rows: host; dst: [n, dim] f32.
  void (*gather_rows)(const ExecContext& ctx, const float* src, const int64_t* rows, int64_t n, int64_t dim,
                      float* dst);
  // out[i, j] = x[i, cols[j]] for j < k (GPTQ's act-order).  x, out: [m, k] f32; cols: host.
  void (*gather_columns)(const ExecContext& ctx, const float* x, int64_t m, int64_t k, const int32_t* cols,
                         float* out);

  // ---- Mixture of experts ----

  // Each of n tokens' top_k experts: softmax of its router logits (max subtracted), the top_k
  // highest (best first; equal logits take the lower expert first, whatever the batch), each
  // with its probability, renormalized over the top_k when `renormalize`.  logits:
  // [n, num_experts] f32; experts: [n, top_k] int32; weights: [n, top_k] f32.
  void (*moe_route)(const ExecContext& ctx, const float* logits, int64_t n, int64_t num_experts, int64_t top_k,
                    bool renormalize, int32_t* experts, float* weights);
  // y[t, :] = sum over j < top_k, in order, of weights[t, j] * rows[row_of[t * top_k + j], :], then
  // + sigmoid(shared_logit[t]) * shared[t, :] when `shared` is set (a shared expert and its gate).
  // rows: [*, dim]; weights: [n, top_k]; shared: [n, dim]; shared_logit: [n]; y: [n, dim] (f32);
  // row_of: host.
  void (*moe_combine)(const ExecContext& ctx, const float* rows, const int64_t* row_of, const float* weights,
                      int64_t n, int64_t top_k, int64_t dim, const float* shared, const float* shared_logit,
                      float* y);

  // ---- Collectives on device memory (tensor parallelism), over a communicator of host bytes ----

  // data[0:n) = the sum over every rank of comm of its data (comm/communicator.h's order).
  Status (*all_reduce)(const ExecContext& ctx, Communicator& comm, float* data, int64_t n);
  // dst = every rank's `bytes` of src, rank by rank.
  Status (*all_gather)(const ExecContext& ctx, Communicator& comm, const void* src, int64_t bytes, void* dst);
};

// A backend's table bound to its context: what the model computes with. Copyable; keeps the
// context alive, so a model's copy outlives the Backend object it came from.
class Kernels {
 public:
  Kernels() = default;
  Kernels(const KernelTable& table, std::shared_ptr<const ExecContext> context)
      : t_(table), ctx_(std::move(context)) {}

  const KernelTable& table() const { return t_; }
  const ExecContext& context() const { return *ctx_; }
  // Device memory (ExecContext::allocate).
  Buffer allocate(size_t bytes) const { return ctx_->allocate(bytes); }

  void matmul(const float* x, int64_t m, const Tensor& w, float* y) const { t_.matmul(*ctx_, x, m, w, y); }
  Tensor pack_matmul_weight(const Tensor& w, Buffer* storage) const { return t_.pack_matmul_weight(*ctx_, w, storage); }
  void matmul_many(const float* x, int64_t m, const Tensor* const* w, float* const* y, int count) const {
    t_.matmul_many(*ctx_, x, m, w, y, count);
  }
  void matmul_grouped(const float* x, const MatmulGroup* groups, int count) const {
    t_.matmul_grouped(*ctx_, x, groups, count);
  }
  void matmul_int(const float* x, int64_t m, const IntWeight& w, float* y) const { t_.matmul_int(*ctx_, x, m, w, y); }
  IntWeight pack_int_weight(const IntWeight& w, Buffer* storage) const { return t_.pack_int_weight(*ctx_, w, storage); }
  void embedding(const Tensor& table, const TokenId* ids, int64_t n, int64_t first_row, float* out) const {
    t_.embedding(*ctx_, table, ids, n, first_row, out);
  }
  void rms_norm(const float* x, const float* weight, int64_t rows, int64_t dim, float eps, float* y) const {
    t_.rms_norm(*ctx_, x, weight, rows, dim, eps, y);
  }
  void rope(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim, const int32_t* positions,
            const float* inv_freq, bool interleaved) const {
    t_.rope(*ctx_, x, num_tokens, num_heads, head_dim, positions, inv_freq, interleaved);
  }
  void silu_mul(const float* gate, const float* up, int64_t n, float* out) const { t_.silu_mul(*ctx_, gate, up, n, out); }
  void add(float* y, const float* x, int64_t n) const { t_.add(*ctx_, y, x, n); }
  void store_kv(const float* k, const float* v, const int64_t* slot_mapping, int64_t num_tokens,
                const KvLayerView& cache) const {
    t_.store_kv(*ctx_, k, v, slot_mapping, num_tokens, cache);
  }
  void paged_attention(const float* q, const AttentionSeq* seqs, int64_t num_seqs, const KvLayerView& cache,
                       const AttentionParams& params, float* out, float* lse = nullptr) const {
    t_.paged_attention(*ctx_, q, seqs, num_seqs, cache, params, out, lse);
  }
  void merge_attention(const float* outs, const float* lses, int64_t parts, int64_t rows, int64_t heads,
                       int64_t head_dim, float* out) const {
    t_.merge_attention(*ctx_, outs, lses, parts, rows, heads, head_dim, out);
  }
  void copy_to_device(void* dst, const void* host_src, size_t bytes) const { t_.copy_to_device(*ctx_, dst, host_src, bytes); }
  void copy_to_host(void* host_dst, const void* src, size_t bytes) const { t_.copy_to_host(*ctx_, host_dst, src, bytes); }
  void zero(void* dst, size_t bytes) const { t_.zero(*ctx_, dst, bytes); }
  Tensor upload(const Tensor& w, Buffer* storage) const { return t_.upload(*ctx_, w, storage); }
  void copy_rows(float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows, int64_t width) const {
    t_.copy_rows(*ctx_, dst, dst_stride, src, src_stride, rows, width);
  }
  void gather_rows(const float* src, const int64_t* rows, int64_t n, int64_t dim, float* dst) const {
    t_.gather_rows(*ctx_, src, rows, n, dim, dst);
  }
  void gather_columns(const float* x, int64_t m, int64_t k, const int32_t* cols, float* out) const {
    t_.gather_columns(*ctx_, x, m, k, cols, out);
  }
  void moe_route(const float* logits, int64_t n, int64_t num_experts, int64_t top_k, bool renormalize,
                 int32_t* experts, float* weights) const {
    t_.moe_route(*ctx_, logits, n, num_experts, top_k, renormalize, experts, weights);
  }
  void moe_combine(const float* rows, const int64_t* row_of, const float* weights, int64_t n, int64_t top_k,
                   int64_t dim, const float* shared, const float* shared_logit, float* y) const {
    t_.moe_combine(*ctx_, rows, row_of, weights, n, top_k, dim, shared, shared_logit, y);
  }
  Status all_reduce(Communicator& comm, float* data, int64_t n) const { return t_.all_reduce(*ctx_, comm, data, n); }
  Status all_gather(Communicator& comm, const void* src, int64_t bytes, void* dst) const {
    return t_.all_gather(*ctx_, comm, src, bytes, dst);
  }

 private:
  KernelTable t_{};
  std::shared_ptr<const ExecContext> ctx_;
};

}  // namespace pagoda
