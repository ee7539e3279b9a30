// The one validator of a request about to enter the engine, run once per request: by the OpenAI
// protocol's parsers (the server, `pagoda generate` and the Python module), or by
// LLMEngine::prepare for a request built in code; so every way in refuses the same requests with
// the same words. What passes is a PreparedRequest, which the engine takes as it is.
//
// Checks, in order: the prompt gives at least one token (an empty text that tokenizes to [BOS]
// is a prompt; no tokens at all is not), every prompt id is in the vocabulary, the sampling
// parameters (SamplingParams::check) with logprobs up to limits.max_logprobs, and prompt +
// max_tokens within max_model_len. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

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

// A request that passed validate_request (its prompt tokenized, every field within the engine's
// limits): what Engine::submit, LLM::generate and LLMEngine::add_request take without checking it
// again. Only prepare_request makes one; read it as the GenerateRequest it is.
class PreparedRequest : public GenerateRequest {
 private:
  explicit PreparedRequest(GenerateRequest r) : GenerateRequest(std::move(r)) {}
  friend std::variant<PreparedRequest, RequestError> prepare_request(GenerateRequest, const RequestLimits&,
                                                                     const RequestFieldNames&);
};

// validate_request, and the request as a PreparedRequest when it passes.
std::variant<PreparedRequest, RequestError> prepare_request(GenerateRequest request, const RequestLimits& limits,
                                                            const RequestFieldNames& names = {});

}  // namespace pagoda
