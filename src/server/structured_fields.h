// The structured-output fields of a request, as vLLM takes them: which constraint a body asks for,
// compiled against the model's vocabulary (structured/grammar_compiler.h) into the engine's
// GrammarConstraint.
//
//   response_format     {"type": "text"} (nothing), {"type": "json_object"}, {"type":
//                       "json_schema", "json_schema": {"name", "schema", "strict"}}
//   structured_outputs  {"json": schema, "regex": str, "choice": [str], "grammar": GBNF,
//                       "json_object": true} (exactly one), with "disable_any_whitespace",
//                       "disable_fallback" (no other backend to fall back to: accepted)
//   guided_json, guided_regex, guided_choice, guided_grammar   (vLLM's older fields)
//
// A schema may be an object or a JSON text. One constraint per request: two are a 400 naming both.
// What the compilers refuse (an unsupported JSON Schema keyword, a lookahead in a regex, a GBNF
// syntax error, a grammar too large to compile) is a 400 that says so and names the field.
// Pure, apart from the compiler's cache; thread-safe.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "engine/engine_types.h"
#include "server/openai_common.h"
#include "structured/grammar_compiler.h"

namespace pagoda::server {

// --structured-outputs-config, vLLM's StructuredOutputsConfig.
struct StructuredOutputsConfig {
  // JSON without whitespace between its tokens (a request's own disable_any_whitespace also).
  bool disable_any_whitespace = false;
  std::string backend = "auto";  // vLLM's backend names are accepted; there is one engine here
};

// From the flag's JSON text: backend, disable_any_whitespace, disable_fallback,
// disable_additional_properties (true only: absent additionalProperties already counts as
// false). Errors name the key.
Result<StructuredOutputsConfig> parse_structured_outputs_config(std::string_view text);

// What a request's constraint needs from the server.
struct StructuredContext {
  structured::GrammarCompiler* grammars = nullptr;  // null: every constraint is a 400
  StructuredOutputsConfig config;
  int max_json_depth = 64;  // for schemas given as JSON text
};

// The constraint `body` asks for (nullopt: none). `body_text` is the body as received, read again
// with its objects' order kept (a schema's properties are written in their order).
// `after_token`: where the constraint starts (GrammarConstraint::after_token).
ApiResult<std::optional<GrammarConstraint>> read_constraint(const nlohmann::json& body, std::string_view body_text,
                                                            const StructuredContext& context,
                                                            std::optional<TokenId> after_token);

// The body's top-level member `key` read again with its objects' order kept (a schema's properties,
// the tools; tokenizer/ordered_json.h), nullopt when absent. Only that member is built, and it may
// hold at most kMaxOrderedKeys keys (the schema compiler looks keys up one by one).
inline constexpr size_t kMaxOrderedKeys = 20000;
ApiResult<std::optional<nlohmann::ordered_json>> ordered_member(std::string_view body_text, const std::string& key);

// The body's fields read_constraint reads (for the list of ignored fields).
bool is_constraint_field(std::string_view key);

}  // namespace pagoda::server
