// Building an LLMEngine from the command line's model and engine flags.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "launch/engine_flags.h"
#include "launch/model_loading.h"
#include "engine/llm_engine.h"
#include "server/openai_request.h"

namespace pagoda::app {

class RankGroup;

struct EngineSetup {
  std::unique_ptr<LLMEngine> engine;  // data-parallel replica 0's, with --data-parallel-size
  // The other data-parallel replicas' (1 .. D - 1): the same configuration and KV cache size,
  // their steps run on their own ranks.
  std::vector<std::unique_ptr<LLMEngine>> replicas;
  std::shared_ptr<const Tokenizer> tokenizer;
  // Structured outputs' grammars over the model's vocabulary, compiled once each (its trie is
  // made on first use).
  std::shared_ptr<structured::GrammarCompiler> grammars;
  GenerationDefaults generation_defaults;  // from --generation-config
  std::string kernels;                     // the backend's description(): the kernel table it picked
};

// Checks the flags, applies --log-level, reads --generation-config, loads the tokenizer and runs
// `before_weights` on it (both fail fast, before any weight is read), then the model, and sizes
// the engine. With more than one rank, `group` is the ranks RankGroup::start started
// (launch/ranks.h; it must outlive the engines): this process loads rank 0's shard, and the
// engine runs every step on all of them. With --data-parallel-size D > 1, `replicas` holds the
// engines of replicas 1 .. D - 1 as well (only the server runs them).
Result<EngineSetup> make_engine(const ModelFlags& model, const EngineFlags& engine,
                                const std::function<Status(const Tokenizer&)>& before_weights = {},
                                RankGroup* group = nullptr);

// The executor of an engine whose rank 0 worker is `worker`: a LocalExecutor with one rank, else
// the group's (GroupExecutor for tensor parallelism, PipelineExecutor with stages).
std::unique_ptr<Executor> make_executor(const EngineConfig& config, RankGroup* group, std::unique_ptr<Worker> worker);

// Registers the backends this build has, once per process (later calls return the first call's
// status): the CPU backend ("cpu"), with the kernel table PAGODA_CPU_ISA forces if set (auto,
// scalar or a compiled table's name, e.g. avx2; for tests and comparisons), and the guarded
// test backend ("guarded", backend/guarded/guarded_backend.h).
Status register_backends();

// What the request parser needs to know about the model, as the server has it: a request's
// optional "model" may name the model path or its file name. Reads setup.engine (call it
// before the engine is moved away); the chat template fields are left empty.
server::ModelContext model_context(const ModelFlags& model, const EngineSetup& setup, int64_t default_max_tokens);

// --generation-config: "auto" reads MODEL/generation_config.json when the model is a folder
// holding one (nothing otherwise), "vllm" gives no defaults, anything else is a folder that
// must hold a generation_config.json. Of the file, as vLLM: temperature, top_p, top_k, min_p,
// repetition_penalty, max_new_tokens; a field of the wrong type is an error naming the file.
Result<GenerationDefaults> load_generation_defaults(const std::string& setting, const std::string& model_path);

}  // namespace pagoda::app
