// OpenAI protocol: the error object and the JSON text both halves write.
#include "server/openai_common.h"

#include <nlohmann/json.hpp>

#include "tokenizer/unicode.h"

namespace pagoda::server {

using ojson = nlohmann::ordered_json;

std::string dump(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

std::string token_string(const Tokenizer& tok, TokenId id) { return unicode::sanitize_utf8(tok.token_bytes(id)); }

ApiError bad_request(std::string message, std::string param, std::string code) {
  ApiError e;
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}

std::string ApiError::to_json() const {
  ojson e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? ojson(nullptr) : ojson(param);
  e["code"] = code.empty() ? ojson(nullptr) : ojson(code);
  return dump({{"error", std::move(e)}});
}

}  // namespace pagoda::server
