#include "model/layers/moe.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace pagoda {

Result<std::unique_ptr<FeedForward>> SparseMoe::load(WeightLoader& w, const std::string& p, const ModelConfig& cfg) {
  auto b = std::make_unique<SparseMoe>();
  // Tensor parallelism splits every expert (and the shared one) by its intermediate features, as
  // the dense MLP; the router and the shared expert's gate are replicated.
  const IndexRange part = w.shard().moe_intermediate, shared_part = w.shard().shared_intermediate;
  const int64_t inter = cfg.moe_intermediate_size, shared_inter = cfg.shared_expert_intermediate_size;
  b->hidden_ = cfg.hidden_size;
  b->inter_ = part.size();
  b->shared_inter_ = shared_part.size();
  b->top_k_ = cfg.num_experts_per_tok;
  b->renormalize_ = cfg.norm_topk_prob;
  b->eps_ = static_cast<float>(cfg.rms_norm_eps);
  b->tp_ = w.shard().tp;
  const int64_t h = cfg.hidden_size;
  PAGODA_ASSIGN_OR_RETURN(b->norm_, w.vector(p + "ffn_norm.weight", h));
  PAGODA_ASSIGN_OR_RETURN(b->router_, w.linear(p + "ffn_gate_inp.weight", cfg.num_experts, h));
  b->experts_.resize(static_cast<size_t>(cfg.num_experts));
  for (int64_t e = 0; e < cfg.num_experts; ++e) {
    Expert& x = b->experts_[static_cast<size_t>(e)];
    const std::string s = "." + std::to_string(e) + ".weight";
    PAGODA_ASSIGN_OR_RETURN(x.gate, w.linear(p + "ffn_gate" + s, inter, h, {}, Slice::rows(part)));
    PAGODA_ASSIGN_OR_RETURN(x.up, w.linear(p + "ffn_up" + s, inter, h, {}, Slice::rows(part)));
    PAGODA_ASSIGN_OR_RETURN(x.down, w.linear(p + "ffn_down" + s, h, inter, {}, Slice::cols(part)));
  }
  if (shared_inter > 0) {
    PAGODA_ASSIGN_OR_RETURN(b->shared_.gate,
                            w.linear(p + "ffn_gate_shexp.weight", shared_inter, h, {}, Slice::rows(shared_part)));
    PAGODA_ASSIGN_OR_RETURN(b->shared_.up,
                            w.linear(p + "ffn_up_shexp.weight", shared_inter, h, {}, Slice::rows(shared_part)));
    PAGODA_ASSIGN_OR_RETURN(b->shared_.down,
                            w.linear(p + "ffn_down_shexp.weight", h, shared_inter, {}, Slice::cols(shared_part)));
    PAGODA_ASSIGN_OR_RETURN(b->shared_gate_, w.linear(p + "ffn_gate_inp_shexp.weight", 1, h));
  }
  return std::unique_ptr<FeedForward>(std::move(b));
}

void SparseMoe::expert_forward(const Kernels& k, const Expert& e, int64_t inter, const float* h_rows, int64_t m,
                               float* out, Workspace& ws) const {
  float *gate = ws.gate.as<float>(), *up = ws.up.as<float>();
  const Linear* gate_up[] = {&e.gate, &e.up};
  float* const gate_up_out[] = {gate, up};
  Linear::apply_many(k, h_rows, m, gate_up, gate_up_out, 2);
  k.silu_mul(gate, up, m * inter, gate);
  e.down.apply(k, gate, m, out);
}

void SparseMoe::forward(const Kernels& k, int64_t n, float* x, Workspace& ws) const {
  const int64_t num_experts = static_cast<int64_t>(experts_.size()), slots = n * top_k_;
  float* h = ws.h.as<float>();
  float* router = ws.router.as<float>();
  float* weights = ws.moe_weight.as<float>();
  k.rms_norm(x, norm_.ptr(), n, hidden_, eps_, h);
  router_.apply(k, h, n, router);
  k.moe_route(router, n, num_experts, top_k_, renormalize_, ws.moe_expert.as<int32_t>(), weights);
  // Which expert each slot went to, on the host: it decides the grouped products' shapes.
  std::vector<int32_t>& expert = ws.moe_expert_host;
  k.copy_to_host(expert.data(), ws.moe_expert.data(), static_cast<size_t>(slots) * sizeof(int32_t));

  // Group the (token, choice) slots by expert, tokens in order: expert e's rows are
  // [first[e], first[e + 1]) of moe_out; row_of[slot] is where a slot's output lands and
  // token_of_row[row] the token it comes from.
  std::vector<int64_t>& first = ws.moe_first;
  first.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t s = 0; s < slots; ++s) ++first[static_cast<size_t>(expert[static_cast<size_t>(s)]) + 1];
  for (int64_t e = 0; e < num_experts; ++e) first[e + 1] += first[e];
  std::vector<int64_t>& next = ws.moe_next;
  next.assign(first.begin(), first.end() - 1);
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t row = next[static_cast<size_t>(expert[static_cast<size_t>(s)])]++;
    ws.moe_row_of[static_cast<size_t>(s)] = row;
    ws.moe_token_of_row[static_cast<size_t>(row)] = s / top_k_;
  }

  // Each slot's normed row, grouped by expert; then every active expert's gate and up over its
  // rows as one grouped product, and their down projections as another.
  float* rows = ws.moe_in.as<float>();
  float *moe_gate = ws.moe_gate.as<float>(), *moe_up = ws.moe_up.as<float>(), *moe_out = ws.moe_out.as<float>();
  k.gather_rows(h, ws.moe_token_of_row.data(), slots, hidden_, rows);
  std::vector<LinearGroup>& groups = ws.moe_groups;
  groups.clear();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = first[e + 1] - first[e];
    if (m == 0) continue;
    const Expert& x_e = experts_[static_cast<size_t>(e)];
    groups.push_back(LinearGroup{first[e], m, &x_e.gate, moe_gate + first[e] * inter_});
    groups.push_back(LinearGroup{first[e], m, &x_e.up, moe_up + first[e] * inter_});
  }
  Linear::apply_grouped(k, rows, groups.data(), static_cast<int>(groups.size()));
  k.silu_mul(moe_gate, moe_up, slots * inter_, moe_gate);
  groups.clear();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = first[e + 1] - first[e];
    if (m == 0) continue;
    const Linear* down = &experts_[static_cast<size_t>(e)].down;
    groups.push_back(LinearGroup{first[e], m, down, moe_out + first[e] * hidden_});
  }
  Linear::apply_grouped(k, moe_gate, groups.data(), static_cast<int>(groups.size()));

  // The shared expert over every token, and its gate's logit per token.
  float* shared = rows;            // [n, hidden]: the gathered rows are done with
  float* shared_logit = router;    // [n]: the router logits are done with
  if (shared_inter_ > 0) {
    expert_forward(k, shared_, shared_inter_, h, n, shared, ws);
    shared_gate_.apply(k, h, n, shared_logit);
  }

  // Each token: its experts' outputs weighted, in the order of its choices, then the shared
  // expert; into h (the normed rows are done with), then added to the residual.
  k.moe_combine(moe_out, ws.moe_row_of.data(), weights, n, top_k_, hidden_, shared_inter_ > 0 ? shared : nullptr,
                shared_inter_ > 0 ? shared_logit : nullptr, h);
  all_reduce_or_throw(k, tp_, h, n * hidden_);  // tensor parallelism: the ranks' partial sums
  k.add(x, h, n * hidden_);
}

int64_t SparseMoe::weight_bytes() const {
  int64_t bytes = norm_.bytes() + router_.weight_bytes();
  for (const Expert& e : experts_) bytes += e.gate.weight_bytes() + e.up.weight_bytes() + e.down.weight_bytes();
  if (shared_inter_ > 0) {
    bytes += shared_.gate.weight_bytes() + shared_.up.weight_bytes() + shared_.down.weight_bytes() +
             shared_gate_.weight_bytes();
  }
  return bytes;
}

}  // namespace pagoda
