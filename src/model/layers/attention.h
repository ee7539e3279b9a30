// AttentionBlock: a pre-norm decoder layer's attention half, x += o_proj(attention(rms_norm(x))):
// q/k/v projections (with biases where the config says attention_bias: Qwen2), a per-head RMSNorm
// on q and k where it says qk_norm (Qwen3), RoPE, the new tokens' K/V stored into the paged
// cache, grouped-query paged attention (with the sliding window), the output projection and the
// residual add. Under tensor parallelism a rank computes its heads only, and o_proj's partial
// sums are all-reduced before the residual add. Built by architectures (model/arch/registry.h) from a WeightLoader.
#pragma once

#include <string>

#include "backend/kernels.h"
#include "base/status.h"
#include "model/forward_batch.h"
#include "model/layers/linear.h"
#include "model/layers/weight_loader.h"
#include "model/layers/workspace.h"

namespace pagoda {

class AttentionBlock {
 public:
  // Reads <prefix>attn_norm.weight, attn_q / attn_k / attn_v / attn_output.weight, and the
  // biases and q/k norms the config calls for (prefix "blk.N."): the loader's shard of them.
  static Result<AttentionBlock> load(WeightLoader& weights, const std::string& prefix, const ModelConfig& cfg);

  // x [n, hidden] += the block's output for the batch's tokens; their K/V go into `cache`.
  // inv_freq: RoPE's [head_dim / 2] frequencies.
  void forward(const Kernels& k, const ForwardBatch& batch, const KvLayerView& cache, const float* inv_freq, float* x,
               Workspace& ws) const;

  int64_t weight_bytes() const;

 private:
  AttentionParams params_;
  int64_t hidden_ = 0;
  float eps_ = 0;
  bool rope_interleaved_ = false;
  TensorParallel tp_;  // the all-reduce of o_proj's partial sums
  F32Vector norm_, bq_, bk_, bv_, q_norm_, k_norm_;  // biases and q/k norms: empty when absent
  Linear wq_, wk_, wv_, wo_;
};

}  // namespace pagoda
