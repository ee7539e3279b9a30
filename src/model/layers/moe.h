// SparseMoe: the feed-forward block of a mixture-of-experts layer (Qwen3-MoE, Qwen2-MoE,
// Mixtral), x += moe(rms_norm(x)). The router scores every expert per token; each token goes to
// its num_experts_per_tok best experts (Kernels::moe_route: softmax over all experts, the top k,
// renormalised to sum 1 where the model asks); the host reads the choices back and groups the batch's tokens are grouped by expert, each active expert's gated
// MLP runs once over its tokens on its own (packed, possibly quantized) weights, all experts'
// gate and up projections as one grouped product (Kernels::matmul_grouped: one parallel step)
// and their down projections as another, and each token
// sums its experts' outputs weighted by their routing weights, in the order of its choices
// (Kernels::moe_combine): a
// token's result does not depend on which other tokens share its experts (the products are
// batch-invariant row by row). Qwen2-MoE adds a shared expert every token passes through,
// scaled by sigmoid(its gate). Not thread-safe (the Workspace is the caller's).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "model/layers/mlp.h"

namespace pagoda {

class SparseMoe final : public FeedForward {
 public:
  // Reads <prefix>ffn_norm.weight, the router <prefix>ffn_gate_inp.weight [experts, hidden],
  // expert e's <prefix>ffn_{gate,up,down}.<e>.weight and, where the config has a shared expert,
  // <prefix>ffn_{gate,up,down}_shexp.weight and its gate <prefix>ffn_gate_inp_shexp.weight
  // [1, hidden]. Fails naming the tensor that is missing or misshapen.
  static Result<std::unique_ptr<FeedForward>> load(WeightLoader& weights, const std::string& prefix,
                                                   const ModelConfig& cfg);
  void forward(const Kernels& k, int64_t n, float* x, Workspace& ws) const override;
  int64_t weight_bytes() const override;

 private:
  struct Expert {
    Linear gate, up, down;
  };
  // h_rows [m, hidden] through one gated MLP of width `inter` into out [m, hidden] (the shared
  // expert).
  void expert_forward(const Kernels& k, const Expert& e, int64_t inter, const float* h_rows, int64_t m, float* out,
                      Workspace& ws) const;

  int64_t hidden_ = 0, inter_ = 0, shared_inter_ = 0, top_k_ = 0;
  bool renormalize_ = false;
  float eps_ = 0;
  TensorParallel tp_;
  F32Vector norm_;
  Linear router_;
  std::vector<Expert> experts_;
  Expert shared_;
  Linear shared_gate_;
};

}  // namespace pagoda
