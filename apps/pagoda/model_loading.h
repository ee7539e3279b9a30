// Loading what a CLI subcommand needs from the common model flags: the backend, the model and
// its tokenizer. Lives in apps/ because it names the concrete backends and reads user flags.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "base/status.h"
#include "loader/model_source.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"

namespace CLI {
class App;
}

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
  // Benchmarks on a built-in config without a tokenizer use the byte tokenizer (their prompts
  // are random ids; only the output text, which nobody reads, suffers).
  bool byte_tokenizer_fallback = false;

  void add_to(CLI::App& app, bool weights);
};

struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};

// Loads the tokenizer: --tokenizer if given, else the model's (a GGUF's vocabulary, an HF
// directory's tokenizer.json, or the byte tokenizer of demo-random).
Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFlags& flags);

// Loads backend, weights and tokenizer, and checks the tokenizer fits the model's vocabulary.
Result<LoadedModel> load_model_and_tokenizer(const ModelFlags& flags);

}  // namespace pagoda::app
