#include "model/layers/moe.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"

namespace pagoda {

void route_tokens(const float* logits, int64_t n, int64_t num_experts, int64_t top_k, bool renormalize,
                  int32_t* experts, float* weights) {
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
  float *gate = ws.gate.data(), *up = ws.up.data();
  const Linear* gate_up[] = {&e.gate, &e.up};
  float* const gate_up_out[] = {gate, up};
  Linear::apply_many(k, h_rows, m, gate_up, gate_up_out, 2);
  k.silu_mul(gate, up, m * inter, gate);
  e.down.apply(k, gate, m, out);
}

void SparseMoe::forward(const Kernels& k, int64_t n, float* x, Workspace& ws) const {
  const int64_t num_experts = static_cast<int64_t>(experts_.size()), slots = n * top_k_;
  float* h = ws.h.data();
  k.rms_norm(x, norm_.ptr(), n, hidden_, eps_, h);
  router_.apply(k, h, n, ws.router.data());
  route_tokens(ws.router.data(), n, num_experts, top_k_, renormalize_, ws.moe_expert.data(), ws.moe_weight.data());

  // Group the (token, choice) slots by expert, tokens in order: expert e's rows are
  // [first[e], first[e + 1]) of moe_out; row_of[slot] is where a slot's output lands and
  // token_of_row[row] the token it comes from.
  std::vector<int64_t>& first = ws.moe_first;
  first.assign(static_cast<size_t>(num_experts + 1), 0);
  for (int64_t s = 0; s < slots; ++s) ++first[static_cast<size_t>(ws.moe_expert[s]) + 1];
  for (int64_t e = 0; e < num_experts; ++e) first[e + 1] += first[e];
  std::vector<int64_t>& next = ws.moe_next;
  next.assign(first.begin(), first.end() - 1);
  for (int64_t s = 0; s < slots; ++s) {
    const int64_t row = next[static_cast<size_t>(ws.moe_expert[s])]++;
    ws.moe_row_of[s] = row;
    ws.moe_token_of_row[row] = s / top_k_;
  }

  // Each slot's normed row, grouped by expert; then every active expert's gate and up over its
  // rows as one grouped product, and their down projections as another.
  float* rows = ws.moe_in.data();
  for (int64_t r = 0; r < slots; ++r) std::copy_n(h + ws.moe_token_of_row[r] * hidden_, hidden_, rows + r * hidden_);
  std::vector<LinearGroup>& groups = ws.moe_groups;
  groups.clear();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = first[e + 1] - first[e];
    if (m == 0) continue;
    const Expert& x_e = experts_[static_cast<size_t>(e)];
    groups.push_back(LinearGroup{first[e], m, &x_e.gate, ws.moe_gate.data() + first[e] * inter_});
    groups.push_back(LinearGroup{first[e], m, &x_e.up, ws.moe_up.data() + first[e] * inter_});
  }
  Linear::apply_grouped(k, rows, groups.data(), static_cast<int>(groups.size()));
  k.silu_mul(ws.moe_gate.data(), ws.moe_up.data(), slots * inter_, ws.moe_gate.data());
  groups.clear();
  for (int64_t e = 0; e < num_experts; ++e) {
    const int64_t m = first[e + 1] - first[e];
    if (m == 0) continue;
    const Linear* down = &experts_[static_cast<size_t>(e)].down;
    groups.push_back(LinearGroup{first[e], m, down, ws.moe_out.data() + first[e] * hidden_});
  }
  Linear::apply_grouped(k, ws.moe_gate.data(), groups.data(), static_cast<int>(groups.size()));

  // The shared expert over every token, and its gate's logit per token.
  float* shared = rows;  // [n, hidden]: the gathered rows are done with
  float* shared_logit = ws.router.data();
  if (shared_inter_ > 0) {
    expert_forward(k, shared_, shared_inter_, h, n, shared, ws);
    shared_gate_.apply(k, h, n, shared_logit);
  }

  // Each token: its experts' outputs weighted, in the order of its choices, then the shared
  // expert; added to the residual.
  for (int64_t t = 0; t < n; ++t) {
    float* y = h + t * hidden_;  // the token's normed row is no longer needed
    std::fill_n(y, hidden_, 0.0f);
    for (int64_t j = 0; j < top_k_; ++j) {
      const float wgt = ws.moe_weight[t * top_k_ + j];
      const float* o = ws.moe_out.data() + ws.moe_row_of[t * top_k_ + j] * hidden_;
      for (int64_t c = 0; c < hidden_; ++c) y[c] += wgt * o[c];
    }
    if (shared_inter_ > 0) {
      const float g = 1.0f / (1.0f + std::exp(-shared_logit[t]));
      const float* o = shared + t * hidden_;
      for (int64_t c = 0; c < hidden_; ++c) y[c] += g * o[c];
    }
  }
  all_reduce_or_throw(tp_, h, n * hidden_);  // tensor parallelism: the ranks' partial sums
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
