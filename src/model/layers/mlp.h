// FeedForward: a pre-norm decoder layer's second half, x += ffn(rms_norm(x)), as an interface:
// the dense SwiGLU MLP here (GatedMlp: down(silu(gate(h)) * up(h))), and the sparse
// mixture-of-experts block next (routing the batch's tokens to a few experts per token), which
// architectures choose per layer (model/arch/registry.h).
#pragma once

#include <memory>
#include <string>

#include "backend/kernels.h"
#include "base/status.h"
#include "model/layers/linear.h"
#include "model/layers/weight_loader.h"
#include "model/layers/workspace.h"

namespace pagoda {

class FeedForward {
 public:
  virtual ~FeedForward() = default;
  // x [n, hidden] += the block's output for n tokens.
  virtual void forward(const Kernels& k, int64_t n, float* x, Workspace& ws) const = 0;
  virtual int64_t weight_bytes() const = 0;
};

class GatedMlp final : public FeedForward {
 public:
  // Reads <prefix>ffn_norm.weight and ffn_gate / ffn_up / ffn_down.weight (the loader's shard:
  // under tensor parallelism, down's partial sums are all-reduced before the residual add).
  static Result<std::unique_ptr<FeedForward>> load(WeightLoader& weights, const std::string& prefix,
                                                   const ModelConfig& cfg);
  void forward(const Kernels& k, int64_t n, float* x, Workspace& ws) const override;
  int64_t weight_bytes() const override;

 private:
  int64_t hidden_ = 0, inter_ = 0;
  float eps_ = 0;
  TensorParallel tp_;
  F32Vector norm_;
  Linear gate_, up_, down_;
};

}  // namespace pagoda
