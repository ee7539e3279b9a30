// OpenAI protocol, the pieces its two halves share: the error object every refusal carries
// (ApiError, ApiResult), and how both write JSON text and token strings. openai_request.h turns
// request bodies into engine requests; openai_response.h turns the engine's output into response
// objects and server-sent events.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <variant>

#include "tokenizer/tokenizer.h"

namespace pagoda::server {

// The OpenAI error object: {"error": {"message", "type", "param", "code"}}; param and code are
// null when empty. `status` is the HTTP status that carries it.
struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";  // authentication_error, not_found_error, ...
  std::string param;
  std::string code;  // OpenAI's string codes: context_length_exceeded, model_not_found, ...

  std::string to_json() const;  // the body, one line, valid UTF-8 whatever the message holds
};

// 400 invalid_request_error.
ApiError bad_request(std::string message, std::string param = "", std::string code = "");

template <typename T>
using ApiResult = std::variant<T, ApiError>;

// `j` as one line of JSON. Every body the protocol writes goes through here: text from the
// model or the user may hold invalid UTF-8, which comes out replaced.
std::string dump(const nlohmann::ordered_json& j);

// True when no array or object in the JSON text `text` nests deeper than `max_depth` (checked
// before the recursive JSON parser sees untrusted text). Brackets inside strings do not count;
// the scan does not otherwise check the syntax.
bool json_nesting_within(std::string_view text, int max_depth);

// Token `id`'s text as a client sees it (invalid UTF-8 replaced).
std::string token_string(const Tokenizer& tok, TokenId id);

}  // namespace pagoda::server
