#include "model/layers/attention.h"

#include <cmath>

namespace pagoda {
namespace {

void add_bias(const Kernels& k, float* x, int64_t rows, const F32Vector& bias, int64_t len) {
  for (int64_t r = 0; r < rows; ++r) k.add(x + r * len, bias.ptr(), len);
}

}  // namespace

Result<AttentionBlock> AttentionBlock::load(WeightLoader& w, const std::string& p, const ModelConfig& cfg) {
  AttentionBlock b;
  const ShardPlan& shard = w.shard();
  const int64_t hidden = cfg.hidden_size, hd = cfg.head_dim;
  const int64_t q_dim = cfg.num_heads * hd, kv_dim = cfg.num_kv_heads * hd;
  // This rank's heads (all of them without tensor parallelism) as rows of q, k, v and columns of o.
  const IndexRange q_part{shard.q_heads.begin * hd, shard.q_heads.end * hd};
  const IndexRange kv_part{shard.kv_heads.begin * hd, shard.kv_heads.end * hd};
  // YaRN scales q.k on top of 1 / sqrt(head_dim) (as scaling both rotated q and k would).
  b.params_ = AttentionParams{shard.q_heads.size(), shard.kv_heads.size(), hd,
                              static_cast<float>(cfg.rope_scaling.attention_scale() / std::sqrt(static_cast<double>(hd))),
                              cfg.sliding_window};
  b.hidden_ = hidden;
  b.eps_ = static_cast<float>(cfg.rms_norm_eps);
  b.rope_interleaved_ = cfg.rope_interleaved;
  b.tp_ = shard.tp;
  PAGODA_ASSIGN_OR_RETURN(b.norm_, w.vector(p + "attn_norm.weight", hidden));
  PAGODA_ASSIGN_OR_RETURN(b.wq_, w.linear(p + "attn_q.weight", q_dim, hidden, {}, Slice::rows(q_part)));
  PAGODA_ASSIGN_OR_RETURN(b.wk_, w.linear(p + "attn_k.weight", kv_dim, hidden, {}, Slice::rows(kv_part)));
  PAGODA_ASSIGN_OR_RETURN(b.wv_, w.linear(p + "attn_v.weight", kv_dim, hidden, {}, Slice::rows(kv_part)));
  PAGODA_ASSIGN_OR_RETURN(b.wo_, w.linear(p + "attn_output.weight", hidden, q_dim, {}, Slice::cols(q_part)));
  if (cfg.attention_bias) {
    PAGODA_ASSIGN_OR_RETURN(b.bq_, w.vector(p + "attn_q.bias", q_dim, q_part));
    PAGODA_ASSIGN_OR_RETURN(b.bk_, w.vector(p + "attn_k.bias", kv_dim, kv_part));
    PAGODA_ASSIGN_OR_RETURN(b.bv_, w.vector(p + "attn_v.bias", kv_dim, kv_part));
  }
  if (cfg.qk_norm) {
    PAGODA_ASSIGN_OR_RETURN(b.q_norm_, w.vector(p + "attn_q_norm.weight", hd));
    PAGODA_ASSIGN_OR_RETURN(b.k_norm_, w.vector(p + "attn_k_norm.weight", hd));
  }
  return b;
}

void AttentionBlock::forward(const Kernels& k, const ForwardBatch& batch, const KvLayerView& cache,
                             const float* inv_freq, float* x, Workspace& ws) const {
  const int64_t n = batch.num_tokens(), nh = params_.num_heads, nkv = params_.num_kv_heads, hd = params_.head_dim;
  float *h = ws.h.as<float>(), *q = ws.q.as<float>(), *kk = ws.k.as<float>(), *v = ws.v.as<float>(), *attn = ws.attn.as<float>();
  k.rms_norm(x, norm_.ptr(), n, hidden_, eps_, h);
  const Linear* qkv[] = {&wq_, &wk_, &wv_};
  float* const qkv_out[] = {q, kk, v};
  Linear::apply_many(k, h, n, qkv, qkv_out, 3);
  if (bq_.bytes() > 0) {
    add_bias(k, q, n, bq_, nh * hd);
    add_bias(k, kk, n, bk_, nkv * hd);
    add_bias(k, v, n, bv_, nkv * hd);
  }
  if (q_norm_.bytes() > 0) {  // every head's vector is one row of the norm
    k.rms_norm(q, q_norm_.ptr(), n * nh, hd, eps_, q);
    k.rms_norm(kk, k_norm_.ptr(), n * nkv, hd, eps_, kk);
  }
  k.rope(q, n, nh, hd, batch.positions.data(), inv_freq, rope_interleaved_);
  k.rope(kk, n, nkv, hd, batch.positions.data(), inv_freq, rope_interleaved_);
  k.store_kv(kk, v, batch.slot_mapping.data(), n, cache);
  k.paged_attention(q, batch.seqs.data(), static_cast<int64_t>(batch.seqs.size()), cache, params_, attn);
  wo_.apply(k, attn, n, h);
  all_reduce_or_throw(k, tp_, h, n * hidden_);  // tensor parallelism: the ranks' partial sums
  k.add(x, h, n * hidden_);
}

int64_t AttentionBlock::weight_bytes() const {
  int64_t bytes = 0;
  for (const Linear* l : {&wq_, &wk_, &wv_, &wo_}) bytes += l->weight_bytes();
  for (const F32Vector* v : {&norm_, &bq_, &bk_, &bv_, &q_norm_, &k_norm_}) bytes += v->bytes();
  return bytes;
}

}  // namespace pagoda
