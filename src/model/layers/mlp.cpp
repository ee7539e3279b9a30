#include "model/layers/mlp.h"

namespace pagoda {

Result<std::unique_ptr<FeedForward>> GatedMlp::load(WeightLoader& w, const std::string& p, const ModelConfig& cfg) {
  auto b = std::make_unique<GatedMlp>();
  const IndexRange part = w.shard().intermediate;  // this rank's intermediate features
  const int64_t h = cfg.hidden_size, inter = cfg.intermediate_size;
  b->hidden_ = h;
  b->inter_ = part.size();
  b->eps_ = static_cast<float>(cfg.rms_norm_eps);
  b->tp_ = w.shard().tp;
  PAGODA_ASSIGN_OR_RETURN(b->norm_, w.vector(p + "ffn_norm.weight", h));
  PAGODA_ASSIGN_OR_RETURN(b->gate_, w.linear(p + "ffn_gate.weight", inter, h, {}, Slice::rows(part)));
  PAGODA_ASSIGN_OR_RETURN(b->up_, w.linear(p + "ffn_up.weight", inter, h, {}, Slice::rows(part)));
  PAGODA_ASSIGN_OR_RETURN(b->down_, w.linear(p + "ffn_down.weight", h, inter, {}, Slice::cols(part)));
  return std::unique_ptr<FeedForward>(std::move(b));
}

void GatedMlp::forward(const Kernels& k, int64_t n, float* x, Workspace& ws) const {
  float *h = ws.h.as<float>(), *gate = ws.gate.as<float>(), *up = ws.up.as<float>();
  k.rms_norm(x, norm_.ptr(), n, hidden_, eps_, h);
  const Linear* gate_up[] = {&gate_, &up_};
  float* const gate_up_out[] = {gate, up};
  Linear::apply_many(k, h, n, gate_up, gate_up_out, 2);
  k.silu_mul(gate, up, n * inter_, gate);
  down_.apply(k, gate, n, h);
  all_reduce_or_throw(k, tp_, h, n * hidden_);  // tensor parallelism: the ranks' partial sums
  k.add(x, h, n * hidden_);
}

int64_t GatedMlp::weight_bytes() const {
  return gate_.weight_bytes() + up_.weight_bytes() + down_.weight_bytes() + norm_.bytes();
}

}  // namespace pagoda
