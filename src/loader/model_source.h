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
// Everything here is plain values and free functions: a WeightMap is immutable once loaded and
// then safe to read from any thread.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "base/sha256.h"
#include "base/status.h"
#include "loader/model_config.h"
#include "tensor/tensor.h"

namespace pagoda {

// A mixture of experts' router (blk.N.ffn_gate_inp.weight, and the shared expert's gate): kept
// in f32 by every quantization mix (model/quant/quant_mix.h) and by dummy weights, as
// llama-quantize keeps it (a few rows whose rounding would move tokens between experts).
bool is_expert_router(std::string_view name);

class WeightMap {
 public:
  // The tensor `name`, or nullptr.
  const Tensor* find(const std::string& name) const;
  // The tensor `name` checked against `shape` (outermost first); fails naming source, tensor,
  // expected and actual shapes, or "missing tensor".
  Result<Tensor> get(const std::string& name, std::initializer_list<int64_t> shape) const;
  Result<Tensor> get(const std::string& name, std::span<const int64_t> shape) const;

  // Adds (or replaces) a tensor; its memory must be kept alive through keep_alive().
  void add(std::string name, Tensor t) { tensors_[std::move(name)] = t; }
  // Adds a tensor whose memory `owner` holds for it alone: release() frees it.
  void add(std::string name, Tensor t, std::shared_ptr<const void> owner);
  // Forgets the tensor `name` (a loader that has copied it); the memory its own owner held goes
  // with it. Views into a shared owner (a file mapping) stay mapped.
  void release(const std::string& name);
  // Keeps `owner` (a mapping, a Buffer) alive as long as this map.
  void keep_alive(std::shared_ptr<const void> owner) { owners_.push_back(std::move(owner)); }
  // Every tensor by canonical name.
  const std::map<std::string, Tensor>& all() const { return tensors_; }
  // The file or directory the weights came from (the prefix of error messages).
  void set_source(std::string source) { source_ = std::move(source); }
  const std::string& source() const { return source_; }

 private:
  std::string source_;  // file or directory, for error messages
  std::map<std::string, Tensor> tensors_;
  std::vector<std::shared_ptr<const void>> owners_;
  std::map<std::string, std::shared_ptr<const void>> tensor_owners_;  // add() with an owner
};

enum class LoadFormat { kAuto, kGguf, kSafetensors, kDummy };
// "auto", "gguf", "safetensors", "dummy"; anything else is kInvalidArgument listing the choices.
Result<LoadFormat> parse_load_format(const std::string& name);

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
//   - a directory with config.json (or that config.json itself): Hugging Face (model.safetensors
//     or an index of shards);
//   - with format kDummy: a config.json, an HF directory, a GGUF, or a preset name from
//     dummy_presets(); weights are deterministic random values of options.dummy_dtype.
// The config is validated and check_weights() passes before this returns. Errors name the file
// or directory (and the tensor); unknown tensors in the files are ignored.
Result<ModelSource> load_model(const std::string& path, const LoadOptions& options);

// True when the file at `path` starts with the GGUF magic (false for directories and missing files).
bool starts_with_gguf_magic(const std::string& path);

// The fingerprint of a model's weights (what the KV disk tier's files are written for, so that
// another checkpoint of the same architecture never uses them): SHA-256 over every tensor's name,
// type, shape and a sample of its bytes (its first, middle and last 256). Reads a few pages of
// each tensor; `weights` must still be the loader's host memory.
Sha256Digest weights_fingerprint(const WeightMap& weights);

// Names of the built-in configs usable with --load-format dummy ("demo-random", "tinyllama-1.1b",
// "llama-110m", "qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b", and the mixtures of experts
// "qwen3-30b-a3b", "qwen1.5-moe-a2.7b", "mixtral-8x7b" at their published shapes); dummy_preset
// returns nullopt for any other name.
std::vector<std::string> dummy_presets();
std::optional<ModelConfig> dummy_preset(const std::string& name);

// One tensor a model with a given config needs, under its canonical name.
struct WeightSpec {
  enum class Kind {
    kMatrix,  // 2-D weight (including token_embd and output): any dtype
    kNorm,    // 1-D RMSNorm weight: f32, f16 or bf16
    kBias,    // 1-D bias: f32, f16 or bf16
  };
  std::string name;
  std::vector<int64_t> shape;  // outermost first
  Kind kind = Kind::kMatrix;
};

// Every tensor `config` needs, in a fixed order (token_embd, output (unless tied), output_norm,
// then each block's tensors), including attention biases (attention_bias) and the q/k norms
// (qk_norm). The config must be valid.
std::vector<WeightSpec> expected_weights(const ModelConfig& config);

// Checks that `weights` holds every tensor of expected_weights(config) with the right shape and
// a usable dtype (norms and biases unquantized). Fails with kNotFound ("<source>: missing tensor
// blk.3.attn_k.weight") or kDataLoss naming the source, the tensor and the expected and actual
// shapes. Extra tensors are allowed.
Status check_weights(const ModelConfig& config, const WeightMap& weights);

// The canonical name of a Hugging Face Llama/Qwen tensor name ("model.layers.3.self_attn.q_proj.
// weight" -> "blk.3.attn_q.weight"; the "model." prefix is optional), or nullopt for names that
// are not weights of these models (e.g. rotary_emb.inv_freq).
std::optional<std::string> canonical_name_from_hf(const std::string& hf_name);
// The inverse: the Hugging Face name of a canonical name, or nullopt.
std::optional<std::string> hf_name_from_canonical(const std::string& canonical_name);

// Deterministic random weights for `config`: every tensor of expected_weights(config), matrices
// uniform in [-1/sqrt(in), 1/sqrt(in)] stored as `dtype`, norms 1 + small noise and biases small
// noise, both always f32. A matrix whose rows are not whole blocks of a quantized `dtype` takes
// its shape fallback (tensor/dtype.h's dtype_for_rows). The same (config, dtype, seed) gives identical bytes.
// `source` names the config in messages and becomes the map's source.
Result<WeightMap> make_dummy_weights(const ModelConfig& config, DType dtype, uint64_t seed,
                                     const std::string& source);
// The bytes make_dummy_weights(config, dtype, ...) allocates (the config must be valid).
int64_t dummy_weight_bytes(const ModelConfig& config, DType dtype);

}  // namespace pagoda
