// ModelConfig: the hyperparameters of a decoder-only transformer, read from config.json or from
// GGUF metadata into one shape. Plain value; validate() checks it before anything is allocated.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda {

// The rotary embedding's scaling, as config.json's rope_scaling declares it (Hugging Face's
// names): linear, dynamic (NTK-aware, vLLM's static form: the base raised for the longest
// context), yarn (Peng et al.: frequencies blended between interpolation and extrapolation by
// their rotations over the original context, and the attention logits scaled by
// attention_factor squared) and llama3 (Llama 3.1's).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kDynamic, kYarn };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0;                    // llama3
  double high_freq_factor = 4.0;                   // llama3
  int64_t original_max_position_embeddings = 8192; // llama3, yarn
  double beta_fast = 32.0;                         // yarn
  double beta_slow = 1.0;                          // yarn
  double attention_factor = 0.0;                   // yarn; 0: 0.1 ln(factor) + 1 (1 for factor <= 1)

  // What q.k is multiplied by on top of 1 / sqrt(head_dim): attention_factor squared for yarn
  // (Hugging Face scales cos and sin, so both q and k, by it), else 1.
  double attention_scale() const;
};

// The quantization a checkpoint declares in config.json's quantization_config (vLLM detects a
// checkpoint's method the same way; layouts in shared/docs/quantization-formats.md 2-4):
//  - "compressed-tensors", format "int-quantized" (W8A8, W4A8): int8 weights ([out, in] "weight",
//    I8; 4-bit codes one per byte) with a scale per output channel or per tensor, or per group
//    for 4 bits ("weight_scale"), int8 activations per token (dynamic) or with a static
//    per-tensor scale ("input_scale");
//  - "compressed-tensors", format "pack-quantized" (W4A16, W8A16): "weight_packed" int32
//    [out, in * bits / 32], "weight_scale" [out, groups], "weight_shape", with "weight_zero_point"
//    when asymmetric and "weight_g_idx" with actorder "group";
//  - "awq" (AutoAWQ GEMM: "qweight" [in, out / 8] interleaved, "qzeros", "scales");
//  - "gptq" ("qweight" [in * bits / 32, out], "qzeros", "scales", "g_idx"; v1's zeros minus one).
// The projections stored so are those; the others (often lm_head) stay as they are stored.
struct CheckpointQuantization {
  std::string method;                // "" = none; "compressed-tensors", "awq", "gptq"
  std::string format;                // compressed-tensors: "int-quantized" or "pack-quantized"
  bool static_input_scales = false;  // int-quantized, input_activations.dynamic false: input_scale
  int bits = 0;                      // 4 or 8 (int-quantized: 8 unless W4A8)
  int64_t group_size = 0;            // columns per scale; 0 = per output channel (or tensor)
  bool symmetric = true;             // packed formats: false = zero points stored
  bool act_order = false;            // g_idx may reorder columns (GPTQ desc_act, actorder "group")
  bool zeros_minus_one = false;      // GPTQ v1: a stored zero point is the real one minus 1
};

struct ModelConfig {
  std::string architecture;  // "llama" (also Mistral, TinyLlama), "qwen2", "qwen3", and the mixtures
                             // of experts "qwen3_moe", "qwen2_moe", "mixtral"
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  // A pipeline stage's config (model/tensor_parallel.h): its layer l is the model's layer
  // first_layer + l; is_sparse_layer and max_intermediate_size count in the model's layers.
  int64_t first_layer = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;  // usually hidden_size / num_heads; Qwen3 sets it explicitly
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // True when RoPE rotates adjacent pairs (2i, 2i+1): GGUF files of the llama arch, whose
  // converter permuted Q/K rows. False for rotate-half (x_i, x_{i+d/2}): HF checkpoints, and
  // GGUF qwen2/qwen3.
  bool rope_interleaved = false;
  bool tie_word_embeddings = false;  // no separate output.weight: the LM head is token_embd
  bool attention_bias = false;       // Q/K/V projections have biases (Qwen2)
  bool qk_norm = false;              // per-head RMSNorm on q and k before RoPE (Qwen3)
  int64_t sliding_window = 0;        // 0 = full attention (Mistral v0.1 declares 4096)

  // Mixture of experts (num_experts > 0): a sparse layer routes each token to
  // num_experts_per_tok of num_experts gated MLPs of width moe_intermediate_size (softmax over
  // the router's logits, the top k, renormalised to sum 1 when norm_topk_prob), plus, where
  // shared_expert_intermediate_size > 0, a shared expert every token passes through, scaled by
  // sigmoid(its gate) (Qwen2-MoE). Layer i is sparse unless it is in mlp_only_layers or (i + 1)
  // is not a multiple of decoder_sparse_step; the other layers are dense MLPs of
  // intermediate_size.
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0;
  bool norm_topk_prob = false;
  int64_t decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  CheckpointQuantization quantization;

  // Checks positivity, divisibility (heads by kv heads), and sane upper bounds, so that sizes
  // computed from the config cannot overflow. `source` names the file in the message.
  Status validate(const std::string& source) const;

  // Number of parameters implied by the shapes (for logs and dummy weights).
  int64_t num_parameters() const;
  // Of those, the ones a token reads: every expert counted once in num_parameters, only
  // num_experts_per_tok of them here (the same number for a dense model).
  int64_t num_active_parameters() const;
  // The longest context the model takes (vLLM's derived max_model_len): max_position_embeddings,
  // times the rope scaling factor for linear and dynamic scaling, and for yarn
  // original_max_position_embeddings times it; llama3 scaling leaves it as it is.
  int64_t max_context_len() const;
  // Whether layer `layer`'s feed-forward block is the sparse mixture of experts.
  bool is_sparse_layer(int64_t layer) const;
  // The widest feed-forward intermediate any layer uses (dense, expert or shared expert).
  int64_t max_intermediate_size() const;
};

}  // namespace pagoda
