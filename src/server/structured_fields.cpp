#include "server/structured_fields.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <vector>

#include "structured/gbnf.h"
#include "structured/json_schema.h"
#include "structured/regex_grammar.h"
#include "tokenizer/ordered_json.h"

namespace pagoda::server {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

// One constraint as asked: its kind and what defines it.
struct Spec {
  std::string field;  // the request field it came from, for errors (e.g. "structured_outputs.regex")
  enum class Kind { kJsonSchema, kJsonObject, kRegex, kChoice, kGrammar } kind = Kind::kJsonObject;
  ordered schema;                    // kJsonSchema
  std::string text;                  // kRegex, kGrammar
  std::vector<std::string> choices;  // kChoice
};

const json* member(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

// A 400 about `field` (a dotted path: "structured_outputs.regex"), whose param is the request's
// top-level field, as OpenAI reports it.
ApiError refuse(const std::string& message, const std::string& field) {
  return bad_request(message, field.substr(0, field.find('.')));
}

ApiError wrong(const std::string& field, const std::string& expected) { return refuse(field + " must be " + expected, field); }

// The same value in the body read with its order kept: the member at `path` (keys from the top).
const ordered* ordered_at(const ordered& root, const std::vector<std::string>& path) {
  const ordered* at = &root;
  for (const std::string& key : path) {
    if (!at->is_object() || !at->contains(key)) return nullptr;
    at = &(*at)[key];
  }
  return at;
}

}  // namespace

ApiResult<std::optional<ordered>> ordered_member(std::string_view body_text, const std::string& key) {
  std::optional<ordered> whole = parse_ordered_json(body_text, kMaxOrderedKeys, &key);
  if (!whole) return bad_request(key + " holds more than " + std::to_string(kMaxOrderedKeys) + " keys", key);
  if (!whole->is_object() || !whole->contains(key)) return std::optional<ordered>();
  return std::optional<ordered>(std::move((*whole)[key]));
}

namespace {

// A schema: an object (or boolean) in the body, or a JSON text.
ApiResult<ordered> read_schema(const json& value, const std::string& field, const std::vector<std::string>& path,
                               std::string_view body_text, const StructuredContext& context) {
  if (value.is_string()) {
    const std::string& text = value.get_ref<const std::string&>();
    if (!json_nesting_within(text, context.max_json_depth)) {
      return refuse(field + " nests deeper than " + std::to_string(context.max_json_depth) + " levels", field);
    }
    std::optional<ordered> parsed = parse_ordered_json(text, kMaxOrderedKeys);
    if (!parsed) {
      return refuse(field + (json::accept(text) ? " holds more than " + std::to_string(kMaxOrderedKeys) + " keys"
                                                : std::string(" is not valid JSON")),
                    field);
    }
    return *parsed;
  }
  if (!value.is_object() && !value.is_boolean()) return wrong(field, "a JSON schema (an object, or its JSON text)");
  // (The body already parsed once, with the same depth limit.)
  ApiResult<std::optional<ordered>> top = ordered_member(body_text, path.front());
  if (auto* e = std::get_if<ApiError>(&top)) return *e;
  const auto& member = std::get<std::optional<ordered>>(top);
  const ordered* at = member ? ordered_at(*member, std::vector<std::string>(path.begin() + 1, path.end())) : nullptr;
  if (!at) return refuse(field + " could not be read again", field);
  return *at;
}

ApiResult<std::vector<std::string>> read_choices(const json& value, const std::string& field) {
  if (!value.is_array() || value.empty()) return wrong(field, "a non-empty array of strings");
  std::vector<std::string> out;
  for (const json& c : value) {
    if (!c.is_string()) return wrong(field, "a non-empty array of strings");
    out.push_back(c.get<std::string>());
  }
  return out;
}

ApiResult<std::string> read_text(const json& value, const std::string& field) {
  if (!value.is_string()) return wrong(field, "a string");
  return value.get<std::string>();
}

// response_format.
ApiResult<std::optional<Spec>> from_response_format(const json& rf, std::string_view body_text,
                                                    const StructuredContext& context) {
  const json* type = rf.is_object() ? member(rf, "type") : nullptr;
  if (!type || !type->is_string()) return wrong("response_format", "an object with a string \"type\"");
  const std::string& t = type->get_ref<const std::string&>();
  if (t == "text") return std::optional<Spec>();
  if (t == "json_object") return std::optional<Spec>(Spec{"response_format", Spec::Kind::kJsonObject, {}, {}, {}});
  if (t != "json_schema") {
    return bad_request("response_format type \"" + t + "\" is not supported (text, json_object, json_schema)",
                       "response_format");
  }
  const json* js = member(rf, "json_schema");
  if (!js || !js->is_object()) return wrong("response_format.json_schema", "an object with the schema");
  const json* schema = member(*js, "schema");
  if (!schema) return bad_request("response_format.json_schema.schema is missing", "response_format");
  ApiResult<ordered> s = read_schema(*schema, "response_format.json_schema.schema",
                                     {"response_format", "json_schema", "schema"}, body_text, context);
  if (auto* e = std::get_if<ApiError>(&s)) return *e;
  return std::optional<Spec>(Spec{"response_format", Spec::Kind::kJsonSchema, std::get<ordered>(std::move(s)), {}, {}});
}

// structured_outputs: exactly one of its constraint keys, and its options.
ApiResult<std::optional<Spec>> from_structured_outputs(const json& so, std::string_view body_text,
                                                       const StructuredContext& context, bool& compact) {
  if (!so.is_object()) return wrong("structured_outputs", "an object");
  std::optional<Spec> spec;
  for (auto it = so.begin(); it != so.end(); ++it) {
    const std::string& key = it.key();
    const std::string field = "structured_outputs." + key;
    const json& v = *it;
    if (v.is_null()) continue;
    std::optional<Spec> found;
    if (key == "json") {
      ApiResult<ordered> s = read_schema(v, field, {"structured_outputs", "json"}, body_text, context);
      if (auto* e = std::get_if<ApiError>(&s)) return *e;
      found = Spec{field, Spec::Kind::kJsonSchema, std::get<ordered>(std::move(s)), {}, {}};
    } else if (key == "regex" || key == "grammar") {
      ApiResult<std::string> t = read_text(v, field);
      if (auto* e = std::get_if<ApiError>(&t)) return *e;
      found = Spec{field, key == "regex" ? Spec::Kind::kRegex : Spec::Kind::kGrammar, {}, std::get<std::string>(t), {}};
    } else if (key == "choice") {
      ApiResult<std::vector<std::string>> c = read_choices(v, field);
      if (auto* e = std::get_if<ApiError>(&c)) return *e;
      found = Spec{field, Spec::Kind::kChoice, {}, {}, std::get<std::vector<std::string>>(std::move(c))};
    } else if (key == "json_object") {
      if (!v.is_boolean()) return wrong(field, "a boolean");
      if (v.get<bool>()) found = Spec{field, Spec::Kind::kJsonObject, {}, {}, {}};
    } else if (key == "disable_any_whitespace" || key == "disable_fallback" || key == "disable_additional_properties") {
      if (!v.is_boolean()) return wrong(field, "a boolean");
      if (key == "disable_any_whitespace") compact = compact || v.get<bool>();
      if (key == "disable_additional_properties" && !v.get<bool>()) {
        return refuse(field + " false is not supported: additionalProperties left out counts as false", field);
      }
    } else {
      return refuse(field + " is not supported", field);
    }
    if (!found) continue;
    if (spec) return refuse("structured_outputs may hold one constraint, not " + spec->field + " and " + field, field);
    spec = std::move(found);
  }
  return spec;
}

// vLLM's older guided_* fields.
ApiResult<std::optional<Spec>> from_guided(const json& body, const char* key, std::string_view body_text,
                                           const StructuredContext& context) {
  const json* v = member(body, key);
  if (!v) return std::optional<Spec>();
  const std::string field = key;
  if (field == "guided_json") {
    ApiResult<ordered> s = read_schema(*v, field, {field}, body_text, context);
    if (auto* e = std::get_if<ApiError>(&s)) return *e;
    return std::optional<Spec>(Spec{field, Spec::Kind::kJsonSchema, std::get<ordered>(std::move(s)), {}, {}});
  }
  if (field == "guided_choice") {
    ApiResult<std::vector<std::string>> c = read_choices(*v, field);
    if (auto* e = std::get_if<ApiError>(&c)) return *e;
    return std::optional<Spec>(Spec{field, Spec::Kind::kChoice, {}, {}, std::get<std::vector<std::string>>(std::move(c))});
  }
  ApiResult<std::string> t = read_text(*v, field);
  if (auto* e = std::get_if<ApiError>(&t)) return *e;
  return std::optional<Spec>(Spec{field, field == "guided_regex" ? Spec::Kind::kRegex : Spec::Kind::kGrammar, {},
                                  std::get<std::string>(t), {}});
}

// The cache key: the kind, the whitespace option and the definition (choices each prefixed with
// its length, so that no two lists give one key).
std::string key_of(const Spec& spec, bool compact) {
  std::string key = std::to_string(static_cast<int>(spec.kind)) + (compact ? "c" : "w") + '\x1f';
  switch (spec.kind) {
    case Spec::Kind::kJsonSchema: key += spec.schema.dump(); break;
    case Spec::Kind::kJsonObject: break;
    case Spec::Kind::kRegex:
    case Spec::Kind::kGrammar: key += spec.text; break;
    case Spec::Kind::kChoice:
      for (const std::string& c : spec.choices) key += std::to_string(c.size()) + ':' + c;
      break;
  }
  return key;
}

Result<structured::Grammar> grammar_of(const Spec& spec, bool compact) {
  const structured::JsonSchemaOptions options{!compact};
  switch (spec.kind) {
    case Spec::Kind::kJsonSchema: return structured::json_schema_grammar(spec.schema, options);
    case Spec::Kind::kJsonObject: return structured::json_object_grammar(options);
    case Spec::Kind::kRegex: return structured::regex_grammar(spec.text);
    case Spec::Kind::kGrammar: return structured::parse_gbnf(spec.text);
    case Spec::Kind::kChoice: return structured::choice_grammar(spec.choices);
  }
  return invalid_argument("unknown constraint");
}

}  // namespace

bool is_constraint_field(std::string_view key) {
  for (const char* k : {"response_format", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
                        "guided_grammar", "guided_whitespace_pattern", "guided_decoding_backend"}) {
    if (key == k) return true;
  }
  return false;
}

ApiResult<std::optional<GrammarConstraint>> read_constraint(const json& body, std::string_view body_text,
                                                            const StructuredContext& context,
                                                            std::optional<TokenId> after_token) {
  bool compact = context.config.disable_any_whitespace;
  std::vector<Spec> specs;
  auto take = [&](ApiResult<std::optional<Spec>> r) -> std::optional<ApiError> {
    if (auto* e = std::get_if<ApiError>(&r)) return *e;
    if (auto& s = std::get<std::optional<Spec>>(r)) specs.push_back(std::move(*s));
    return std::nullopt;
  };
  if (const json* rf = member(body, "response_format")) {
    if (auto e = take(from_response_format(*rf, body_text, context))) return *e;
  }
  if (const json* so = member(body, "structured_outputs")) {
    if (auto e = take(from_structured_outputs(*so, body_text, context, compact))) return *e;
  }
  for (const char* key : {"guided_json", "guided_regex", "guided_choice", "guided_grammar"}) {
    if (auto e = take(from_guided(body, key, body_text, context))) return *e;
  }
  if (const json* ws = member(body, "guided_whitespace_pattern")) {
    if (!ws->is_string() || !ws->get_ref<const std::string&>().empty()) {
      return bad_request("guided_whitespace_pattern is not supported (disable_any_whitespace is)",
                         "guided_whitespace_pattern");
    }
  }
  if (specs.empty()) return std::optional<GrammarConstraint>();
  if (specs.size() > 1) {
    return refuse("a request may ask for one structured output, not " + specs[0].field + " and " + specs[1].field,
                  specs[1].field);
  }
  const Spec& spec = specs[0];
  if (!context.grammars) return refuse(spec.field + ": structured outputs are not available for this model", spec.field);
  auto compiled = context.grammars->get(key_of(spec, compact), [&] { return grammar_of(spec, compact); });
  if (!compiled.ok()) return refuse(spec.field + ": " + compiled.status().message(), spec.field);
  return std::optional<GrammarConstraint>(GrammarConstraint{*compiled, after_token});
}

Result<StructuredOutputsConfig> parse_structured_outputs_config(std::string_view text) {
  const json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument("--structured-outputs-config must be a JSON object, got " + std::string(text));
  }
  StructuredOutputsConfig c;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& key = it.key();
    const json& v = *it;
    auto flag = [&](bool& out) -> Status {
      if (!v.is_boolean()) return invalid_argument("--structured-outputs-config: " + key + " must be a boolean");
      out = v.get<bool>();
      return Status::ok_status();
    };
    if (key == "backend") {
      static const char* kBackends[] = {"auto", "xgrammar", "guidance", "outlines", "lm-format-enforcer"};
      const bool known = v.is_string() && std::any_of(std::begin(kBackends), std::end(kBackends), [&](const char* b) {
                           return v.get_ref<const std::string&>() == b;
                         });
      if (!known) {
        return invalid_argument("--structured-outputs-config: backend must be one of auto, xgrammar, guidance, "
                                "outlines, lm-format-enforcer (all served by pagoda's own), got " + v.dump());
      }
      c.backend = v.get<std::string>();
    } else if (key == "disable_any_whitespace") {
      PAGODA_RETURN_IF_ERROR(flag(c.disable_any_whitespace));
    } else if (key == "disable_fallback") {
      bool unused = false;
      PAGODA_RETURN_IF_ERROR(flag(unused));
    } else if (key == "disable_additional_properties") {
      bool on = true;
      PAGODA_RETURN_IF_ERROR(flag(on));
      if (!on) {
        return invalid_argument("--structured-outputs-config: disable_additional_properties false is not supported");
      }
    } else {
      return invalid_argument("--structured-outputs-config: " + key + " is not supported");
    }
  }
  return c;
}

}  // namespace pagoda::server
