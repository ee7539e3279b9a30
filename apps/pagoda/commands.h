// The subcommands of the pagoda binary. Each returns the process exit status and prints errors
// as one line on stderr.
#pragma once

#include <optional>
#include <string>

#include "apps/pagoda/engine_flags.h"
#include "apps/pagoda/model_loading.h"

namespace pagoda::app {

int fail(const Status& status);

struct GenerateFlags {
  ModelFlags model;
  EngineFlags engine;
  std::string prompt;
  std::string input_file;   // JSONL batch mode
  std::string output_file;  // default: stdout
  int64_t max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 0;
  double min_p = 0.0;
  std::optional<uint64_t> request_seed;
  bool ignore_eos = false;
  bool no_add_special = false;
  bool verbose = false;
};
int run_generate(const GenerateFlags& flags);

struct BenchThroughputFlags {
  ModelFlags model;
  EngineFlags engine;
  int64_t input_len = 128;
  int64_t output_len = 128;
  int64_t num_prompts = 16;
  uint64_t dataset_seed = 0;
  std::string output_json;  // optional machine-readable result
};
int run_bench_throughput(const BenchThroughputFlags& flags);

}  // namespace pagoda::app
