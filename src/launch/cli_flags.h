// The command line of the model and engine flags: binds ModelFlags and EngineFlags to CLI11
// options named as vLLM names them, in vLLM's help groups. What parses a command line (apps/pagoda
// and the Python module, which turns keywords into these flags) links this; the engine library
// (libpagoda.so) does not.
#pragma once

#include <string>
#include <vector>

#include "launch/engine_flags.h"
#include "launch/model_loading.h"

namespace CLI {
class App;
}

namespace pagoda::app {

// vLLM's help groups (`pagoda serve --help=CacheConfig`).
inline constexpr const char* kModelConfig = "ModelConfig";
inline constexpr const char* kLoadConfig = "LoadConfig";
inline constexpr const char* kCacheConfig = "CacheConfig";
inline constexpr const char* kParallelConfig = "ParallelConfig";
inline constexpr const char* kSchedulerConfig = "SchedulerConfig";
inline constexpr const char* kSpeculativeConfig = "SpeculativeConfig";
inline constexpr const char* kKvTransferConfig = "KVTransferConfig";
inline constexpr const char* kFrontend = "Frontend";
inline constexpr const char* kPagodaGroup = "Pagoda";  // ours, with no vLLM counterpart

// The flags every subcommand that loads a model takes (--model, --tokenizer, ...; with `weights`
// also the load flags: --dtype, --quantization, --load-format, --threads, ...), bound to `f`.
void add_model_flags(CLI::App& app, ModelFlags& f, bool weights);
// The engine flags of serve, generate and bench (vLLM's CacheConfig, SchedulerConfig,
// SpeculativeConfig, ModelConfig and ParallelConfig groups), bound to `f`.
void add_engine_flags(CLI::App& app, EngineFlags& f);

// vLLM writes -tp / -pp / -dp / -sc as single-dash long options, which CLI11 cannot parse:
// rewrites them (and -tp=N) to --tensor-parallel-size and friends before parsing.
std::vector<std::string> rewrite_vllm_short_options(int argc, char** argv);

}  // namespace pagoda::app
