// The one validator of a request about to enter the engine: used by EngineCore::prepare (the
// Engine, LLM and CLI paths) and by the OpenAI protocol (the server and `pagoda generate`), so
// that every way in refuses the same requests with the same words.
//
// Checks, in order: the prompt gives at least one token (an empty text that tokenizes to [BOS]
// is a prompt; no tokens at all is not), every prompt id is in the vocabulary, the sampling
// parameters (SamplingParams::check) with logprobs up to limits.max_logprobs, and prompt +
// max_tokens within max_model_len. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "engine/engine_types.h"

namespace pagoda {

struct RequestLimits {
  int64_t vocab_size = 0;                                // > 0
  int64_t max_model_len = 0;                             // > 0
  int64_t max_logprobs = SamplingParams::kMaxLogprobs;   // logprobs and prompt_logprobs
};

// What a caller calls the fields the validator names (the chat API says "messages" for the
// prompt, "max_completion_tokens" or "max_tokens", and "top_logprobs").
struct RequestFieldNames {
  std::string prompt = "prompt";
  std::string max_tokens = "max_tokens";
  std::string logprobs = "logprobs";
};

// A refused request: the field at fault (in the caller's names), a one-line message, and
// OpenAI's error code where one applies ("context_length_exceeded").
struct RequestError {
  std::string param;
  std::string message;
  std::string code;
};

// Checks a request whose prompt_token_ids are filled in. nullopt when it may run.
std::optional<RequestError> validate_request(const GenerateRequest& request, const RequestLimits& limits,
                                             const RequestFieldNames& names = {});

}  // namespace pagoda
