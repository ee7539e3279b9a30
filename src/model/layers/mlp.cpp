#include "model/layers/mlp.h"

namespace pagoda {

Result<std::unique_ptr<FeedForward>> GatedMlp::load(WeightLoader& w, const std::string& p, const ModelConfig& cfg) {
  auto b = std::make_unique<GatedMlp>();
  b->hidden_ = cfg.hidden_size;
  b->inter_ = cfg.intermediate_size;
  b->eps_ = static_cast<float>(cfg.rms_norm_eps);
  PAGODA_ASSIGN_OR_RETURN(b->norm_, w.vector(p + "ffn_norm.weight", cfg.hidden_size));
  PAGODA_ASSIGN_OR_RETURN(b->gate_, w.linear(p + "ffn_gate.weight", cfg.intermediate_size, cfg.hidden_size));
  PAGODA_ASSIGN_OR_RETURN(b->up_, w.linear(p + "ffn_up.weight", cfg.intermediate_size, cfg.hidden_size));
  PAGODA_ASSIGN_OR_RETURN(b->down_, w.linear(p + "ffn_down.weight", cfg.hidden_size, cfg.intermediate_size));
  return std::unique_ptr<FeedForward>(std::move(b));
}

void GatedMlp::forward(const Kernels& k, int64_t n, float* x, Workspace& ws) const {
  float *h = ws.h.data(), *gate = ws.gate.data(), *up = ws.up.data();
  k.rms_norm(x, norm_.ptr(), n, hidden_, eps_, h);
  const Linear* gate_up[] = {&gate_, &up_};
  float* const gate_up_out[] = {gate, up};
  Linear::apply_many(k, h, n, gate_up, gate_up_out, 2);
  k.silu_mul(gate, up, n * inter_, gate);
  down_.apply(k, gate, n, h);
  k.add(x, h, n * hidden_);
}

int64_t GatedMlp::weight_bytes() const {
  return gate_.weight_bytes() + up_.weight_bytes() + down_.weight_bytes() + norm_.bytes();
}

}  // namespace pagoda
