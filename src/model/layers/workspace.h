// Workspace: the scratch rows the blocks of one forward pass share (model/layers/attention.h,
// mlp.h, moe.h), in the device's memory, grown to the largest batch seen and reused; owned by the
// model, used by one thread. The mixture-of-experts bookkeeping the host computes from the
// routing (which rows go to which expert) is host memory beside it.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/kernels.h"
#include "loader/model_config.h"
#include "model/layers/linear.h"

namespace pagoda {

// `b` holding at least `count` floats (device memory from `k`); its contents are undefined after
// growing.
inline float* device_floats(const Kernels& k, Buffer& b, int64_t count) {
  const size_t bytes = static_cast<size_t>(count) * sizeof(float);
  if (b.size() < bytes) b = k.allocate(bytes);
  return b.as<float>();
}

struct Workspace {
  // Device memory. h [T, hidden]: a block's normed input, then its output before the residual
  // add; q, attn [T, heads * head_dim]; k, v [T, kv_heads * head_dim]; gate, up [T, the widest
  // intermediate].
  Buffer h, q, k, v, attn, gate, up;
  // Sparse layers (model/layers/moe.h), device memory: router [T, experts] (then the shared
  // expert's gate logits); per (token, choice) slot, grouped by expert: moe_in [T * top_k, hidden]
  // the token's normed row (then the shared expert's output), moe_gate and moe_up [T * top_k, moe
  // intermediate], moe_out [T * top_k, hidden] the expert's output; per slot its expert and weight.
  Buffer router, moe_in, moe_gate, moe_up, moe_out, moe_weight, moe_expert;
  // Host: the slots' experts as the routing chose them; per slot its row, per row its token;
  // moe_first [experts + 1] each expert's first row, moe_next the rows being filled; moe_groups
  // the products of one grouped call.
  std::vector<int32_t> moe_expert_host;
  std::vector<int64_t> moe_row_of, moe_token_of_row, moe_first, moe_next;
  std::vector<LinearGroup> moe_groups;

  void ensure(const Kernels& kernels, int64_t tokens, const ModelConfig& c) {
    if (tokens <= capacity_) return;
    capacity_ = tokens;
    auto grow = [&](Buffer& b, int64_t width) { device_floats(kernels, b, tokens * width); };
    grow(h, c.hidden_size);
    grow(q, c.num_heads * c.head_dim);
    grow(attn, c.num_heads * c.head_dim);
    grow(k, c.num_kv_heads * c.head_dim);
    grow(v, c.num_kv_heads * c.head_dim);
    grow(gate, c.max_intermediate_size());
    grow(up, c.max_intermediate_size());
    if (c.num_experts > 0) {
      grow(router, c.num_experts);
      grow(moe_in, c.num_experts_per_tok * c.hidden_size);
      grow(moe_gate, c.num_experts_per_tok * c.moe_intermediate_size);
      grow(moe_up, c.num_experts_per_tok * c.moe_intermediate_size);
      grow(moe_out, c.num_experts_per_tok * c.hidden_size);
      grow(moe_weight, c.num_experts_per_tok);
      grow(moe_expert, c.num_experts_per_tok);  // int32, as wide as a float
      moe_expert_host.resize(static_cast<size_t>(tokens * c.num_experts_per_tok));
      moe_row_of.resize(static_cast<size_t>(tokens * c.num_experts_per_tok));
      moe_token_of_row.resize(static_cast<size_t>(tokens * c.num_experts_per_tok));
    }
  }

 private:
  int64_t capacity_ = 0;
};

}  // namespace pagoda
