// The small Llama-shaped config the model tests build random models of: vocabulary 61, hidden 32,
// feed-forward 48, 3 layers, 4 query heads over 2 KV heads of 8 (a GQA group of 2).
#pragma once

#include "loader/model_config.h"

namespace pagoda::testing {

inline ModelConfig small_llama_config() {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 3;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000;
  return c;
}

}  // namespace pagoda::testing
