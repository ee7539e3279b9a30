// LLM: the offline API, like vLLM's LLM.generate: give it prompts, get back every completion,
// in input order. Drives an LLMEngine on the calling thread (no engine thread); a progress
// callback sees each finished request. Not thread-safe.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/llm_engine.h"

namespace pagoda {

struct CompletionOutput {
  int64_t index = 0;
  std::string text;
  std::vector<TokenId> token_ids;
  std::vector<SampledOutput> logprobs;
  FinishReason finish_reason = FinishReason::kNone;
  std::string stop_string;
  TokenId stop_token = -1;
};

struct RequestOutput {
  std::vector<TokenId> prompt_token_ids;
  std::vector<SampledOutput> prompt_logprobs;
  std::vector<CompletionOutput> outputs;  // n of them, by index
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;          // over all n
  int64_t cached_tokens = 0;
  RequestTimings timings;                 // of the sequence that finished last
};

class LLM {
 public:
  explicit LLM(std::unique_ptr<LLMEngine> engine) : engine_(std::move(engine)) {}

  // Runs every request to completion. Fails before running anything if one is invalid (the
  // message names its position and the problem). `interrupted`, asked after each step: true
  // aborts every request of the call and fails (the engine stays usable).
  Result<std::vector<RequestOutput>> generate(std::vector<GenerateRequest> requests,
                                              const std::function<void(size_t done, size_t total)>& progress = {},
                                              const std::function<bool()>& interrupted = {});
  // The same for requests a parser checked already (server/openai_request.h), as they are.
  Result<std::vector<RequestOutput>> generate(const std::vector<PreparedRequest>& requests,
                                              const std::function<void(size_t done, size_t total)>& progress = {},
                                              const std::function<bool()>& interrupted = {});

  // The same prompts with one set of parameters.
  Result<std::vector<RequestOutput>> generate(const std::vector<std::string>& prompts, const SamplingParams& params);

  LLMEngine& engine() { return *engine_; }
  EngineCore& core() { return engine_->core(); }

 private:
  std::unique_ptr<LLMEngine> engine_;
  RequestId next_id_ = 1;
};

}  // namespace pagoda
