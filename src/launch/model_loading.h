// Loading what a CLI subcommand needs from the common model flags: the backend, the model and
// its tokenizer. Lives in launch/, the composition root, because it names the concrete backends
// and reads user flags.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "base/status.h"
#include "loader/model_source.h"
#include "model/model.h"
#include "speculative/speculative_config.h"
#include "tokenizer/tokenizer.h"

namespace pagoda::app {

// Flags shared by every subcommand that loads a model (named as vLLM names them).
struct ModelFlags {
  std::string model = "demo-random";
  std::string tokenizer;           // default: the model's own
  std::string load_format = "auto";
  std::string dtype = "auto";      // dummy weights: f32, f16, bf16, q8_0, q4_0
  uint64_t weights_seed = 0;       // dummy weights
  std::string backend = "cpu";
  int threads = 0;                 // CPU backend threads; 0 = one per physical core
  std::string quantization;        // vLLM's --quantization; "" = none
  std::string tokenizer_mode = "auto";
  bool trust_remote_code = false;  // accepted: nothing from a model folder is ever run
  std::string revision, tokenizer_revision, code_revision, download_dir;  // accepted: nothing is downloaded
  // vLLM's --hf-overrides (a JSON object of config.json fields), --rope-scaling (JSON) and
  // --rope-theta, applied to the model's config in that order (loader/config_parsers.h's
  // apply_hf_overrides: rope_scaling, rope_theta, max_position_embeddings).
  std::string hf_overrides, rope_scaling;
  std::optional<double> rope_theta;
  // Benchmarks on a built-in config without a tokenizer use the byte tokenizer (their prompts
  // are random ids; only the output text, which nobody reads, suffers).
  bool byte_tokenizer_fallback = false;

  // Fails on a value Pagoda does not support (yet), before anything is read.
  Status check() const;
  // Applies the config overrides (hf_overrides, rope_scaling, rope_theta) to *c.
  Status apply_config_overrides(ModelConfig* c) const;
  // Logs a warning for each accepted flag that has no effect here but might be expected to
  // (--revision, --tokenizer-revision, --download-dir).
  void warn_no_effect() const;
};

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  Sha256Digest weights_fingerprint{};  // loader/model_source.h's weights_fingerprint (the whole model's)
};

// Loads the tokenizer: --tokenizer if given, else the model's (a GGUF's vocabulary, an HF
// directory's tokenizer.json, or the byte tokenizer of demo-random).
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFlags& flags);

// Loads the tokenizer, runs `before_weights` on it (the caller's checks that must fail fast: a
// chat template, say), then the backend and weights, and checks the tokenizer fits the model's
// vocabulary. So a missing tokenizer or a bad template fails in well under a second, before any
// weight is read or generated.
// With tp.size > 1, the model is rank tp.rank's shard; with pp.size > 1, the layers of stage
// pp.stage (model/tensor_parallel.h).
Result<LoadedModel> load_model_and_tokenizer(const ModelFlags& flags,
                                             const std::function<Status(const Tokenizer&)>& before_weights = {},
                                             const TensorParallel& tp = {}, const PipelineParallel& pp = {});

// A chat template and the bos_token / eos_token texts it is rendered with.
struct ChatTemplateSource {
  std::string text;  // empty: the model has none
  std::string bos, eos;
};

// `chat_template` (vLLM's --chat-template: a file, or the template text itself) when not empty,
// else the template in the tokenizer's files: a GGUF's tokenizer.chat_template, or an HF
// directory's tokenizer_config.json (whose bos_token / eos_token then win over the vocabulary's),
// or for a built-in config's byte tokenizer (demo-random) a simple one of Pagoda's:
// "<s><|user|>\nHi\n<|assistant|>\n" for one user message and the generation prompt.
Result<ChatTemplateSource> find_chat_template(const std::string& chat_template, const ModelFlags& flags,
                                              const Tokenizer& tok);

// The draft model's flags (speculative decoding): the model's, for another path (vLLM: the draft
// loads as the target does, so dummy weights stay dummy), with the draft's own vocabulary.
ModelFlags draft_flags(const ModelFlags& model, const SpeculativeConfig& spec);
// Loads the draft model (its whole weights, on every rank); the error names it.
Result<std::unique_ptr<Model>> load_draft_model(const ModelFlags& draft);

// A worker rank's shard: the same without the tokenizer (rank 0 loads and checks it; a worker
// detokenizes nothing), so `tokenizer` is null.
Result<LoadedModel> load_model_shard(const ModelFlags& flags, const TensorParallel& tp, const PipelineParallel& pp);

}  // namespace pagoda::app
