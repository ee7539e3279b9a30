// The prompt files of the benchmarks (`bench throughput --dataset-path`, `bench serve
// --dataset-name jsonl`): one JSON object per line, {"prompt": "...", "output_len": N}, with
// output_len optional; blank lines are skipped.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda::app::bench {

struct FilePrompt {
  std::string prompt;
  int64_t output_len = 0;  // the line's, or the default
};

// Up to `max_prompts` prompts of `path`. Errors name the file and line; an empty file is one.
Result<std::vector<FilePrompt>> read_prompt_file(const std::string& path, int64_t max_prompts,
                                                 int64_t default_output_len);

}  // namespace pagoda::app::bench
