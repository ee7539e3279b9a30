#include "engine/request_validation.h"

#include <limits>

#include "base/check.h"

namespace pagoda {

namespace {

int64_t saturating_add(int64_t a, int64_t b) {
  return b > std::numeric_limits<int64_t>::max() - a ? std::numeric_limits<int64_t>::max() : a + b;
}

// OpenAI's context_length_exceeded error. When even the prompt leaves no room for one token,
// the prompt is at fault; otherwise max_tokens is.
std::optional<RequestError> check_context(int64_t prompt_tokens, int64_t max_tokens, int64_t limit,
                                          const RequestFieldNames& names) {
  const std::string& what = names.prompt;
  const std::string head = "This model's maximum context length is " + std::to_string(limit) + " tokens. ";
  if (prompt_tokens >= limit) {
    return RequestError{what,
                        head + "However, your " + what + " resulted in " + std::to_string(prompt_tokens) +
                            " tokens. Please reduce the length of the " + what + ".",
                        "context_length_exceeded"};
  }
  if (max_tokens > limit - prompt_tokens) {
    return RequestError{names.max_tokens,
                        head + "However, you requested " + std::to_string(saturating_add(prompt_tokens, max_tokens)) +
                            " tokens (" + std::to_string(prompt_tokens) + " in the " + what + ", " +
                            std::to_string(max_tokens) + " in the completion). Please reduce the length of the " +
                            what + " or completion.",
                        "context_length_exceeded"};
  }
  return std::nullopt;
}

}  // namespace

std::optional<RequestError> validate_request(const GenerateRequest& r, const RequestLimits& limits,
                                             const RequestFieldNames& names) {
  PAGODA_CHECK(limits.vocab_size > 0 && limits.max_model_len > 0);
  if (r.prompt_token_ids.empty()) {
    return RequestError{names.prompt, "the " + names.prompt + " must give at least one token", ""};
  }
  for (TokenId id : r.prompt_token_ids) {
    if (id < 0 || id >= limits.vocab_size) {
      return RequestError{names.prompt,
                          names.prompt + " token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                              std::to_string(limits.vocab_size) + ")",
                          ""};
    }
  }
  if (std::optional<InvalidParam> bad = r.params.check(limits.vocab_size, limits.max_logprobs)) {
    std::string param = bad->param;
    if (param == "max_tokens") param = names.max_tokens;
    if (param == "logprobs") param = names.logprobs;
    return RequestError{std::move(param), std::move(bad->message), ""};
  }
  return check_context(static_cast<int64_t>(r.prompt_token_ids.size()), r.params.max_tokens, limits.max_model_len,
                       names);
}

std::variant<PreparedRequest, RequestError> prepare_request(GenerateRequest request, const RequestLimits& limits,
                                                            const RequestFieldNames& names) {
  if (std::optional<RequestError> bad = validate_request(request, limits, names)) return std::move(*bad);
  return PreparedRequest(std::move(request));
}

}  // namespace pagoda
