#include "backend/cpu/scalar/reference_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kv_rows.h"
#include "base/check.h"
#include "tensor/convert.h"
#include "tensor/half.h"
#include "tensor/quant_blocks.h"

namespace pagoda::cpu {
namespace {

// Quantized weights: the activations are quantized to BlockQ8Act and every 32-element chunk's
// product is integer dots, scaled as QuantChunk (tensor/quant_blocks.h) defines.
void matmul_quantized(const float* x, int64_t m, const Tensor& w, float* y) {
  const DTypeTraits& traits = dtype_traits(w.dtype);
  const int64_t n = w.num_rows();
  const int64_t k = w.row_len();
  const int64_t nb = k / kQuantBlock;
  const int64_t chunks_per_block = traits.block_elems / kQuantBlock;
  std::vector<BlockQ8Act> xq(static_cast<size_t>(m * nb));
  for (int64_t i = 0; i < m; ++i) quantize_activation_row(x + i * k, xq.data() + i * nb, k);
  std::vector<QuantChunk> chunks(static_cast<size_t>(nb));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t b = 0; b < k / traits.block_elems; ++b) {
      traits.decode_chunks(w.row(j) + b * traits.block_bytes, chunks.data() + b * chunks_per_block);
    }
    for (int64_t i = 0; i < m; ++i) {
      float acc = 0;
      for (int64_t c = 0; c < nb; ++c) {
        const QuantChunk& wc = chunks[static_cast<size_t>(c)];
        const BlockQ8Act& xb = xq[static_cast<size_t>(i * nb + c)];
        int32_t dot[2] = {0, 0}, sum[2] = {0, 0};
        for (int t = 0; t < kQuantBlock; ++t) {
          dot[t / 16] += int32_t{wc.q[t]} * xb.qs[t];
          sum[t / 16] += xb.qs[t];
        }
        const int32_t ints = wc.sc[0] * dot[0] + wc.sc[1] * dot[1];
        acc = acc + static_cast<float>(ints) * (wc.d * xb.d);
        if (traits.has_mins) {
          const int32_t mins = wc.mn[0] * sum[0] + wc.mn[1] * sum[1];
          acc = acc - static_cast<float>(mins) * (wc.dmin * xb.d);
        }
      }
      y[i * n + j] = acc;
    }
  }
}

void matmul(const ExecContext&, const float* x, int64_t m, const Tensor& w, float* y) {
  PAGODA_CHECK(w.layout == TensorLayout::kRowMajor && "the reference matmul reads row-major weights");
  if (is_quantized(w.dtype)) return matmul_quantized(x, m, w, y);
  const int64_t n = w.num_rows();
  const int64_t k = w.row_len();
  // Convert each weight row once and reuse it for every input row.
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    dequantize_row(w.dtype, w.row(j), row.data(), k);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * k;
      float acc = 0;
      for (int64_t t = 0; t < k; ++t) acc += xi[t] * row[t];
      y[i * n + j] = acc;
    }
  }
}

void matmul_int(const ExecContext&, const float* x, int64_t m, const IntWeight& w, float* y) {
  PAGODA_CHECK(w.layout == TensorLayout::kRowMajor && "the reference matmul_int reads row-major codes");
  PAGODA_CHECK((w.bits == 8 || w.bits == 4) && w.group_size > 0 && w.k % w.group_size == 0);
  const int64_t k = w.k, groups = w.groups();
  std::vector<int8_t> xq(static_cast<size_t>(k));
  std::vector<int8_t> row(static_cast<size_t>(k));
  for (int64_t i = 0; i < m; ++i) {
    const float s_x = quantize_activation_row_int8(x + i * k, k, w.input_scale, xq.data());
    for (int64_t j = 0; j < w.n; ++j) {
      const auto* codes = static_cast<const uint8_t*>(w.codes) + j * w.row_code_bytes();
      for (int64_t t = 0; t < k; ++t) {
        row[static_cast<size_t>(t)] = w.bits == 8 ? static_cast<int8_t>(codes[t]) : static_cast<int8_t>(int4_code(codes, t));
      }
      float acc = 0;
      for (int64_t g = 0; g < groups; ++g) {
        int64_t dot = 0, xsum = 0;  // the exact bracket (it fits int32)
        for (int64_t t = g * w.group_size; t < (g + 1) * w.group_size; ++t) {
          dot += int64_t{xq[static_cast<size_t>(t)]} * row[static_cast<size_t>(t)];
          xsum += xq[static_cast<size_t>(t)];
        }
        if (w.zero_points != nullptr) dot -= int64_t{w.zero_points[j * groups + g]} * xsum;
        acc = acc + static_cast<float>(static_cast<int32_t>(dot)) * (w.scales[j * groups + g] * s_x);
      }
      y[i * w.n + j] = acc;
    }
  }
}

void embedding(const ExecContext&, const Tensor& table, const TokenId* ids, int64_t n, int64_t first_row,
               float* out) {
  const int64_t dim = table.row_len();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = int64_t{ids[i]} - first_row;
    if (row >= 0 && row < table.num_rows()) {
      dequantize_row(table.dtype, table.row(row), out + i * dim, dim);
    } else {
      std::fill_n(out + i * dim, dim, 0.0f);
    }
  }
}

void rms_norm(const ExecContext&, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
              float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    float inv = static_cast<float>(1.0 / std::sqrt(sum / static_cast<double>(dim) + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

void rope(const ExecContext&, float* x, int64_t num_tokens, int64_t num_heads, int64_t head_dim,
          const int32_t* positions, const float* inv_freq, bool interleaved) {
  const int64_t half = head_dim / 2;
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t i = 0; i < half; ++i) {
      // Angles in double: positions reach 10^5 and more, where f32 angle errors grow visible.
      double angle = static_cast<double>(positions[t]) * inv_freq[i];
      float c = static_cast<float>(std::cos(angle));
      float s = static_cast<float>(std::sin(angle));
      for (int64_t h = 0; h < num_heads; ++h) {
        float* v = x + (t * num_heads + h) * head_dim;
        int64_t a = interleaved ? 2 * i : i;
        int64_t b = interleaved ? 2 * i + 1 : i + half;
        float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
      }
    }
  }
}

void silu_mul(const ExecContext&, const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) {
    float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void add(const ExecContext&, float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void store_kv(const ExecContext&, const float* k, const float* v, const int64_t* slot_mapping, int64_t num_tokens,
              const KvLayerView& cache) {
  const int64_t hd = cache.head_dim, row = cache.num_kv_heads * hd;
  for (int64_t t = 0; t < num_tokens; ++t) {
    const int64_t slot = slot_mapping[t];
    for (int64_t h = 0; h < cache.num_kv_heads; ++h) {
      write_kv_row(cache, false, slot, h, k + t * row + h * hd);
      write_kv_row(cache, true, slot, h, v + t * row + h * hd);
    }
  }
}

void paged_attention(const ExecContext&, const float* q, const AttentionSeq* seqs, int64_t num_seqs,
                     const KvLayerView& cache, const AttentionParams& p, float* out, float* lse) {
  const int64_t hd = p.head_dim;
  const int64_t group = p.num_heads / p.num_kv_heads;
  std::vector<float> scores, kt(static_cast<size_t>(hd)), vt(static_cast<size_t>(hd));
  for (int64_t s = 0; s < num_seqs; ++s) {
    const AttentionSeq& seq = seqs[s];
    scores.resize(static_cast<size_t>(seq.context_len));
    for (int64_t j = 0; j < seq.num_query; ++j) {
      const int64_t pos = seq.context_len - seq.num_query + j;
      const int64_t first = p.sliding_window > 0 ? std::max<int64_t>(0, pos - p.sliding_window + 1) : 0;
      const int64_t row = seq.query_start + j;
      for (int64_t h = 0; h < p.num_heads; ++h) {
        const int64_t kvh = h / group;
        const float* qh = q + (row * p.num_heads + h) * hd;
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t t = first; t <= pos; ++t) {
          int64_t slot = seq.block_table[t / cache.block_size] * cache.block_size + t % cache.block_size;
          read_kv_row(cache, false, slot, kvh, kt.data());
          float dot = 0;
          for (int64_t d = 0; d < hd; ++d) dot += qh[d] * kt[d];
          scores[t] = dot * p.scale;
          max_score = std::max(max_score, scores[t]);
        }
        double denom = 0;
        for (int64_t t = first; t <= pos; ++t) {
          scores[t] = std::exp(scores[t] - max_score);
          denom += scores[t];
        }
        if (lse != nullptr) lse[row * p.num_heads + h] = static_cast<float>(max_score + std::log(denom));
        float* oh = out + (row * p.num_heads + h) * hd;
        std::fill(oh, oh + hd, 0.0f);
        for (int64_t t = first; t <= pos; ++t) {
          int64_t slot = seq.block_table[t / cache.block_size] * cache.block_size + t % cache.block_size;
          read_kv_row(cache, true, slot, kvh, vt.data());
          float w = static_cast<float>(scores[t] / denom);
          for (int64_t d = 0; d < hd; ++d) oh[d] += w * vt[d];
        }
      }
    }
  }
}

void merge_attention(const ExecContext&, const float* outs, const float* lses, int64_t parts, int64_t rows,
                     int64_t heads, int64_t head_dim, float* out) {
  const int64_t vectors = rows * heads;
  for (int64_t v = 0; v < vectors; ++v) {
    float most = -std::numeric_limits<float>::infinity();
    for (int64_t part = 0; part < parts; ++part) most = std::max(most, lses[part * vectors + v]);
    float* o = out + v * head_dim;
    std::fill(o, o + head_dim, 0.0f);
    if (most == -std::numeric_limits<float>::infinity()) continue;
    float sum = 0;
    for (int64_t part = 0; part < parts; ++part) {
      const float lse = lses[part * vectors + v];
      if (lse == -std::numeric_limits<float>::infinity()) continue;
      const float w = std::exp(lse - most);
      sum += w;
      const float* op = outs + (part * vectors + v) * head_dim;
      for (int64_t d = 0; d < head_dim; ++d) o[d] += w * op[d];
    }
    for (int64_t d = 0; d < head_dim; ++d) o[d] /= sum;
  }
}

// Host memory is this device's: copies are memcpy, and a weight is read where it lies.
void copy_to_device(const ExecContext&, void* dst, const void* host_src, size_t bytes) { std::memcpy(dst, host_src, bytes); }
void copy_to_host(const ExecContext&, void* host_dst, const void* src, size_t bytes) { std::memcpy(host_dst, src, bytes); }
void zero(const ExecContext&, void* dst, size_t bytes) { std::memset(dst, 0, bytes); }
Tensor upload(const ExecContext&, const Tensor& w, Buffer*) { return w; }

// The codes, scales and zero points copied into the context's memory, row-major as they were.
IntWeight pack_int_weight(const ExecContext& ctx, const IntWeight& w, Buffer* storage) {
  const size_t code_bytes = static_cast<size_t>(w.n * w.row_code_bytes());
  const size_t num_scales = static_cast<size_t>(w.n * w.groups());
  const size_t zero_bytes = w.zero_points != nullptr ? num_scales * sizeof(int32_t) : 0;
  const size_t scales_at = (code_bytes + 63) / 64 * 64;
  const size_t zeros_at = scales_at + (num_scales * sizeof(float) + 63) / 64 * 64;
  *storage = ctx.allocate(zeros_at + zero_bytes);
  auto* base = storage->as<uint8_t>();
  std::memcpy(base, w.codes, code_bytes);
  std::memcpy(base + scales_at, w.scales, num_scales * sizeof(float));
  if (zero_bytes > 0) std::memcpy(base + zeros_at, w.zero_points, zero_bytes);
  IntWeight out = w;
  out.codes = base;
  out.scales = reinterpret_cast<const float*>(base + scales_at);
  out.zero_points = zero_bytes > 0 ? reinterpret_cast<const int32_t*>(base + zeros_at) : nullptr;
  return out;
}

void copy_rows(const ExecContext&, float* dst, int64_t dst_stride, const float* src, int64_t src_stride, int64_t rows,
               int64_t width) {
  for (int64_t i = 0; i < rows; ++i) std::copy_n(src + i * src_stride, width, dst + i * dst_stride);
}

void gather_rows(const ExecContext&, const float* src, const int64_t* rows, int64_t n, int64_t dim, float* dst) {
  for (int64_t i = 0; i < n; ++i) std::copy_n(src + rows[i] * dim, dim, dst + i * dim);
}

void gather_columns(const ExecContext&, const float* x, int64_t m, int64_t k, const int32_t* cols, float* out) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t t = 0; t < k; ++t) out[i * k + t] = x[i * k + cols[t]];
  }
}

void moe_route(const ExecContext&, const float* logits, int64_t n, int64_t num_experts, int64_t top_k,
               bool renormalize, int32_t* experts, float* weights) {
  PAGODA_CHECK(top_k >= 1 && top_k <= num_experts);
  std::vector<int32_t> order(static_cast<size_t>(num_experts));
  for (int64_t t = 0; t < n; ++t) {
    const float* l = logits + t * num_experts;
    for (int64_t e = 0; e < num_experts; ++e) order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
    // Best first; equal logits keep the lower expert first, whatever the batch.
    std::partial_sort(order.begin(), order.begin() + top_k, order.end(),
                      [l](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    const float top = l[order[0]];
    float sum = 0;
    for (int64_t e = 0; e < num_experts; ++e) sum += std::exp(l[e] - top);
    float chosen = 0;
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      experts[t * top_k + j] = e;
      weights[t * top_k + j] = std::exp(l[e] - top) / sum;
      chosen += weights[t * top_k + j];
    }
    if (renormalize) {
      for (int64_t j = 0; j < top_k; ++j) weights[t * top_k + j] /= chosen;
    }
  }
}

void moe_combine(const ExecContext&, const float* rows, const int64_t* row_of, const float* weights, int64_t n,
                 int64_t top_k, int64_t dim, const float* shared, const float* shared_logit, float* y) {
  for (int64_t t = 0; t < n; ++t) {
    float* out = y + t * dim;
    std::fill_n(out, dim, 0.0f);
    for (int64_t j = 0; j < top_k; ++j) {
      const float w = weights[t * top_k + j];
      const float* o = rows + row_of[t * top_k + j] * dim;
      for (int64_t c = 0; c < dim; ++c) out[c] += w * o[c];
    }
    if (shared != nullptr) {
      const float g = 1.0f / (1.0f + std::exp(-shared_logit[t]));
      const float* o = shared + t * dim;
      for (int64_t c = 0; c < dim; ++c) out[c] += g * o[c];
    }
  }
}

Status all_reduce(const ExecContext&, Communicator& comm, float* data, int64_t n) { return comm.all_reduce_sum(data, n); }
Status all_gather(const ExecContext&, Communicator& comm, const void* src, int64_t bytes, void* dst) {
  return comm.all_gather(src, bytes, dst);
}

}  // namespace

const KernelTable& reference_kernels() {
  static const KernelTable kernels{
      .matmul = matmul,
      .pack_matmul_weight = nullptr,
      .matmul_many = nullptr,
      .matmul_grouped = nullptr,
      .matmul_int = matmul_int,
      .pack_int_weight = pack_int_weight,
      .embedding = embedding,
      .rms_norm = rms_norm,
      .rope = rope,
      .silu_mul = silu_mul,
      .add = add,
      .store_kv = store_kv,
      .paged_attention = paged_attention,
      .merge_attention = merge_attention,
      .copy_to_device = copy_to_device,
      .copy_to_host = copy_to_host,
      .zero = zero,
      .upload = upload,
      .copy_rows = copy_rows,
      .gather_rows = gather_rows,
      .gather_columns = gather_columns,
      .moe_route = moe_route,
      .moe_combine = moe_combine,
      .all_reduce = all_reduce,
      .all_gather = all_gather,
  };
  return kernels;
}

}  // namespace pagoda::cpu
