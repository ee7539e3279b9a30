// Loading a model: files on disk (a GGUF file or a Hugging Face directory) or dummy weights, into
// one ModelConfig plus a WeightMap of tensors under canonical names.
//
// Canonical tensor names follow GGUF's (the shortest common vocabulary):
//   token_embd.weight [vocab, hidden]        output.weight [vocab, hidden] (absent when tied)
//   output_norm.weight [hidden]
//   blk.N.attn_norm.weight [hidden]          blk.N.ffn_norm.weight [hidden]
//   blk.N.attn_q.weight [heads*head_dim, hidden]   blk.N.attn_q.bias (Qwen2)
//   blk.N.attn_k.weight [kv_heads*head_dim, hidden] blk.N.attn_k.bias
//   blk.N.attn_v.weight [kv_heads*head_dim, hidden] blk.N.attn_v.bias
//   blk.N.attn_output.weight [hidden, heads*head_dim]
//   blk.N.attn_q_norm.weight [head_dim]      blk.N.attn_k_norm.weight [head_dim] (Qwen3)
//   blk.N.ffn_gate.weight [inter, hidden]    blk.N.ffn_up.weight [inter, hidden]
//   blk.N.ffn_down.weight [hidden, inter]
// Shapes are outermost first (see tensor/tensor.h). Weights stay in their file type and point
// into the memory mapping when the file's layout allows; the WeightMap keeps the mappings alive.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/model_config.h"
#include "tensor/tensor.h"

namespace pagoda {

class WeightMap {
 public:
  // The tensor `name`, or nullptr.
  const Tensor* find(const std::string& name) const;
  // The tensor `name` checked against `shape` (outermost first); fails naming source, tensor,
  // expected and actual shapes, or "missing tensor".
  Result<Tensor> get(const std::string& name, std::initializer_list<int64_t> shape) const;

  void add(std::string name, Tensor t) { tensors_[std::move(name)] = t; }
  // Keeps `owner` (a mapping, a Buffer) alive as long as this map.
  void keep_alive(std::shared_ptr<const void> owner) { owners_.push_back(std::move(owner)); }
  const std::map<std::string, Tensor>& all() const { return tensors_; }
  void set_source(std::string source) { source_ = std::move(source); }
  const std::string& source() const { return source_; }

 private:
  std::string source_;  // file or directory, for error messages
  std::map<std::string, Tensor> tensors_;
  std::vector<std::shared_ptr<const void>> owners_;
};

enum class LoadFormat { kAuto, kGguf, kSafetensors, kDummy };
Result<LoadFormat> parse_load_format(const std::string& name);  // "auto", "gguf", "safetensors", "dummy"

struct LoadOptions {
  LoadFormat format = LoadFormat::kAuto;
  // For dummy weights: the dtype to generate (f32, f16, bf16, q8_0, q4_0) and the seed.
  DType dummy_dtype = DType::kF32;
  uint64_t dummy_seed = 0;
};

struct ModelSource {
  std::string path;        // as given: a .gguf file, an HF directory, or a preset name
  LoadFormat format = LoadFormat::kAuto;  // the format actually loaded
  ModelConfig config;
  WeightMap weights;
};

// Loads the config and weights at `path`:
//   - a file ending in .gguf (or any file starting with the GGUF magic): GGUF;
//   - a directory with config.json: Hugging Face (model.safetensors or an index of shards);
//   - with format kDummy: a config.json, an HF directory, a GGUF, or a preset name from
//     dummy_presets(); weights are deterministic random values of options.dummy_dtype.
Result<ModelSource> load_model(const std::string& path, const LoadOptions& options);

// Names of the built-in configs usable with --load-format dummy ("demo-random", "tinyllama-1.1b",
// "llama-110m", "qwen2.5-0.5b", ...).
std::vector<std::string> dummy_presets();
std::optional<ModelConfig> dummy_preset(const std::string& name);

}  // namespace pagoda
