// Kernels: the table of compute operations a backend provides to the model.
//
// This is the seam between the model (which knows the math of an architecture) and a backend
// (which knows how to do each op fast on its hardware). Every entry has a scalar reference in
// backend/cpu/scalar; fast variants must match it. Activations are f32; weight
// matrices stay in their stored DType (in a backend's packed layout where the table has
// pack_matmul_weight) and the kernel converts on the fly. All pointers are
// borrowed; kernels allocate nothing the caller sees (pack_matmul_weight fills the Buffer it is
// handed). Tables are immutable: thread-safe.
#pragma once

#include <cstdint>
#include <string_view>

#include "base/types.h"
#include "tensor/kv_cache_dtype.h"
#include "tensor/tensor.h"

namespace pagoda {

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

struct Kernels {
  // y[m, n] = sum_k x[m, k] * w[n, k].  x: [m, k] f32; w: [n, k] any DType the traits mark
  // dense_matmul (every one but i8, whose codes go through matmul_int); y: [m, n] f32.
  // For quantized weights x is first quantized per 32-element block (BlockQ8Act,
  // tensor/quant_blocks.h) and each block's product is computed in exact integers and scaled as
  // QuantChunk defines. Each output's summation order must not depend on m (batch invariance).
  void (*matmul)(const float* x, int64_t m, const Tensor& w, float* y);

  // Optional (nullptr: matmul reads row-major weights as stored). Rearranges a row-major matmul
  // weight [n, k] into the layout this table's matmul reads, in memory it allocates into
  // *storage; returns the view to hand matmul from then on (same dtype and shape, layout
  // kBackendPacked). Where it is set, matmul takes only weights it returned. Products are those of
  // the row-major weight. Called at load.
  Tensor (*pack_matmul_weight)(const Tensor& w, Buffer* storage);

  // Optional (nullptr: one matmul per weight). Several products of one input, y[i] = x w[i]^T for
  // i < count, each bit for bit what matmul(x, m, *w[i], y[i]) writes, as one parallel step: the
  // input converted once and one wait for the workers instead of count (q/k/v, gate/up). The
  // weights share dtype, row length and layout.
  void (*matmul_many)(const float* x, int64_t m, const Tensor* const* w, float* const* y, int count) = nullptr;

  // Optional (nullptr: one matmul per group). Products of different rows of one input with
  // different weights, as a mixture of experts runs each active expert over its tokens: for each
  // group g, g.y = x[g.row, g.row + g.m) g.w^T, each bit for bit what matmul(x + g.row * k, g.m,
  // *g.w, g.y) writes, as one parallel step (the input converted once, the work split by cost
  // across the pool, one wait). x: [rows, k] f32, every row some group's; the weights share dtype,
  // row length k and layout. Groups with m == 0 are skipped.
  void (*matmul_grouped)(const float* x, const MatmulGroup* groups, int count) = nullptr;

  // y[i, j] = sum_t x[i, t] * w(j, t) with x's rows quantized to int8 first. Row i: s_i =
  // w.input_scale, or max_t |x[i, t]| / 127 per token; xq[i, t] = x[i, t] * (1 / s_i) (127 /
  // max|x_i| per token) rounded to nearest even and saturated to [-127, 127] (an all-zero row stays
  // zero). Then y[i, j] = sum over groups g, in order, from 0, of
  // float(sum_{t in g} xq[i, t] * code(j, t) - zero(j, g) * sum_{t in g} xq[i, t]) *
  // (scale(j, g) * s_i): exact int32 dots (the whole bracket fits int32: |code - zero| <= 256,
  // and callers keep group_size <= 65536), one multiply and one add per group, so a row's
  // result never depends on m. x: [m, k] f32; y: [m, n] f32.
  void (*matmul_int)(const float* x, int64_t m, const IntWeight& w, float* y);

  // Optional (nullptr: matmul_int reads row-major codes). As pack_matmul_weight, for IntWeight:
  // the codes, scales and zero points copied, rearranged, into *storage for this table's matmul_int (the
  // returned view points there; the originals may be freed).
  IntWeight (*pack_int_weight)(const IntWeight& w, Buffer* storage);

  // out[i, :] = row ids[i] of table, converted to f32.  table: [rows, dim] any DType.
  void (*embedding)(const Tensor& table, const TokenId* ids, int64_t n, float* out);

  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * weight.  x, y: [rows, dim]; weight: [dim] f32.
  // y may alias x.
  void (*rms_norm)(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* y);

  // Rotary embedding in place on x: [num_tokens, num_heads, head_dim] f32. Token t is rotated by
  // angle positions[t] * inv_freq[i] for pair i (head_dim/2 pairs). interleaved: pairs are
  // (2i, 2i+1); otherwise (i, i + head_dim/2) ("rotate half").
  void (*rope)(float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
               const int32_t* positions, const float* inv_freq, bool interleaved);

  // out[i] = silu(gate[i]) * up[i] for n elements; out may alias gate.
  void (*silu_mul)(const float* gate, const float* up, int64_t n, float* out);

  // y[i] += x[i] for n elements.
  void (*add)(float* y, const float* x, int64_t n);

  // Stores k, v: [num_tokens, num_kv_heads, head_dim] f32 into the cache at slot_mapping[t],
  // converted to the cache's dtype (rounded to nearest even; fp8 saturates; int8 sets the row's
  // scale).
  void (*store_kv)(const float* k, const float* v, const int64_t* slot_mapping, int64_t num_tokens,
                   const KvLayerView& cache);

  // Causal attention of each sequence's queries over its cached keys/values, read as the f32
  // values of the cache's dtype (GQA: query head h reads kv head h / (num_heads / num_kv_heads)). Query row j of a sequence sits at position
  // context_len - num_query + j. q, out: [num_tokens, num_heads, head_dim] f32.
  void (*paged_attention)(const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                          const KvLayerView& cache, const AttentionParams& params, float* out);
};

}  // namespace pagoda
