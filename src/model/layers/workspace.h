// Workspace: the scratch rows the blocks of one forward pass share (model/layers/attention.h,
// mlp.h), grown to the largest batch seen and reused; owned by the model, used by one thread.
#pragma once

#include <cstdint>
#include <vector>

#include "loader/model_config.h"

namespace pagoda {

struct Workspace {
  // h [T, hidden]: a block's normed input, then its output before the residual add; q, attn
  // [T, heads * head_dim]; k, v [T, kv_heads * head_dim]; gate, up [T, intermediate].
  std::vector<float> h, q, k, v, attn, gate, up;

  void ensure(int64_t tokens, const ModelConfig& c) {
    if (tokens <= capacity_) return;
    capacity_ = tokens;
    auto grow = [tokens](std::vector<float>& v, int64_t width) { v.resize(static_cast<size_t>(tokens * width)); };
    grow(h, c.hidden_size);
    grow(q, c.num_heads * c.head_dim);
    grow(attn, c.num_heads * c.head_dim);
    grow(k, c.num_kv_heads * c.head_dim);
    grow(v, c.num_kv_heads * c.head_dim);
    grow(gate, c.intermediate_size);
    grow(up, c.intermediate_size);
  }

 private:
  int64_t capacity_ = 0;
};

}  // namespace pagoda
