// Reading a ModelConfig from a Hugging Face config.json or from GGUF metadata.
//
// Both return a config that already passed ModelConfig::validate. Unknown architectures and
// unsupported features (rope scaling types other than linear/llama3/dynamic/yarn, partial rotary, MLP
// biases) fail with kUnimplemented naming them; missing or mistyped fields fail with kDataLoss
// naming the source and the field. Stateless free functions: thread-safe.
#pragma once

#include <string>

#include "base/status.h"
#include "loader/gguf_file.h"
#include "loader/model_config.h"

namespace pagoda {

// From the text of a config.json. `source` (the file's path) prefixes every error message.
// Architectures: LlamaForCausalLM / MistralForCausalLM -> "llama", Qwen2ForCausalLM -> "qwen2"
// (attention_bias forced on), Qwen3ForCausalLM -> "qwen3" (qk_norm on), and the mixtures of
// experts Qwen3MoeForCausalLM -> "qwen3_moe", Qwen2MoeForCausalLM -> "qwen2_moe" (with a shared
// expert), MixtralForCausalLM -> "mixtral" (ModelConfig's MoE fields). architectures[0] decides
// when present, else model_type. rope_interleaved is always false (HF checkpoints rotate halves).
Result<ModelConfig> config_from_hf_json(const std::string& json_text, const std::string& source);

// Reads the file `path` and parses it with config_from_hf_json.
Result<ModelConfig> config_from_hf_file(const std::string& path);

// From the metadata (general.architecture in llama, qwen2, qwen3, qwen2moe, qwen3moe; <arch>.*
// keys; a llama file with <arch>.expert_count is Mixtral, every layer of a file with experts
// sparse, the top k renormalised except for qwen2moe unless <arch>.expert_weights_norm says)
// and tensor list of a GGUF file: tie_word_embeddings is true when output.weight is absent; rope_interleaved is
// true for the llama arch; a llama3 rope_freqs.weight tensor is recognized when it matches
// Llama 3's scaling with low_freq_factor 1, high_freq_factor 4 and an original context of 8192.
Result<ModelConfig> config_from_gguf(const GgufFile& gguf);

// vLLM's --hf-overrides (and --rope-scaling / --rope-theta, which it folds into them): a JSON
// object of config.json fields that replace the checkpoint's, whatever its format. Supported:
// rope_scaling (config.json's form, or null for none), rope_theta, max_position_embeddings; any
// other key is kUnimplemented naming it, bad JSON or values kInvalidArgument / kDataLoss. `source`
// (the flag's name) prefixes errors; *c is changed only on success.
Status apply_hf_overrides(const std::string& json_text, const std::string& source, ModelConfig* c);

}  // namespace pagoda
