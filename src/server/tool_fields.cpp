#include "server/tool_fields.h"

#include <nlohmann/json.hpp>

#include "structured/json_schema.h"

namespace pagoda::server {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

// The tools in their written order, checked: each a function with a non-empty name, names unique.
ApiResult<ordered> read_tool_list(const json& tools, std::string_view body_text) {
  if (!tools.is_array()) return bad_request("tools must be an array", "tools");
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string where = "tools[" + std::to_string(i) + "]";
    const json* type = t.is_object() && t.contains("type") ? &t["type"] : nullptr;
    if (!type || *type != "function") return bad_request(where + " must be {\"type\": \"function\", ...}", "tools");
    const json* f = t.contains("function") ? &t["function"] : nullptr;
    if (!f || !f->is_object()) return bad_request(where + ".function must be an object", "tools");
    const json* name = f->contains("name") ? &(*f)["name"] : nullptr;
    if (!name || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      return bad_request(where + ".function.name must be a non-empty string", "tools");
    }
    if (f->contains("parameters") && !(*f)["parameters"].is_object() && !(*f)["parameters"].is_null()) {
      return bad_request(where + ".function.parameters must be a JSON schema object", "tools");
    }
    for (size_t k = 0; k < i; ++k) {
      if (tools[k]["function"]["name"] == *name) {
        return bad_request("tools name " + name->dump() + " twice", "tools");
      }
    }
  }
  ApiResult<std::optional<ordered>> listed = ordered_member(body_text, "tools");
  if (auto* e = std::get_if<ApiError>(&listed)) return *e;
  if (!std::get<std::optional<ordered>>(listed)) return bad_request("tools could not be read again", "tools");
  return *std::get<std::optional<ordered>>(listed);
}

// A function's arguments schema: its parameters, an object whatever else they say (a schema
// without a type would take any value), or any object.
ordered parameters_of(const ordered& tool) {
  const ordered& f = tool["function"];
  if (!f.contains("parameters") || !f["parameters"].is_object()) return ordered{{"type", "object"}};
  ordered p = f["parameters"];
  bool typed = false;
  for (const char* key : {"type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"}) typed = typed || p.contains(key);
  if (!typed) p["type"] = "object";
  return p;
}

// `schema` embedded at `at` (a JSON pointer) in a larger one: its references to its own root
// ("#", "#/$defs/x") made to point where it now is. Values that are data, not schemas (const,
// enum, default, examples), are left as they are.
void rebase_refs(ordered& schema, const std::string& at) {
  if (schema.is_array()) {
    for (ordered& e : schema) rebase_refs(e, at);
    return;
  }
  if (!schema.is_object()) return;
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    const std::string& key = it.key();
    if (key == "const" || key == "enum" || key == "default" || key == "examples") continue;
    if (key == "$ref" && it->is_string() && it->get_ref<const std::string&>().rfind('#', 0) == 0) {
      *it = at + it->get<std::string>().substr(1);
    } else {
      rebase_refs(*it, at);
    }
  }
}

// The text of each `"parameters"` value of a JSON array of {"name", "parameters"} objects, as
// written (a parse and a dump would re-spell numbers through doubles). `text` is what the grammar
// made: valid JSON.
std::vector<std::string_view> parameter_texts(std::string_view text) {
  std::vector<std::string_view> out;
  int depth = 0;
  bool in_string = false;
  size_t key_start = 0;
  std::string_view last_key;
  size_t value_start = std::string_view::npos;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
        if (depth == 2) last_key = text.substr(key_start, i - key_start);
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
      key_start = i + 1;
    } else if (c == ':' && depth == 2 && last_key == "parameters") {
      value_start = i + 1;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']' || (c == ',' && depth == 2)) {
      if (depth == 2 && value_start != std::string_view::npos) {
        std::string_view v = text.substr(value_start, i - value_start);
        while (!v.empty() && (v.front() == ' ' || v.front() == '\t' || v.front() == '\n' || v.front() == '\r')) v.remove_prefix(1);
        while (!v.empty() && (v.back() == ' ' || v.back() == '\t' || v.back() == '\n' || v.back() == '\r')) v.remove_suffix(1);
        out.push_back(v);
        value_start = std::string_view::npos;
      }
      if (c != ',') --depth;
    }
  }
  return out;
}

}  // namespace

ApiResult<ToolRequest> read_tools(const json& body, std::string_view body_text, const ToolContext& tools,
                                  const StructuredContext& structured, std::optional<TokenId> after_token) {
  ToolRequest out;
  const json* list = body.contains("tools") && !body["tools"].is_null() ? &body["tools"] : nullptr;
  const json* choice = body.contains("tool_choice") && !body["tool_choice"].is_null() ? &body["tool_choice"] : nullptr;
  if (const json* p = body.contains("parallel_tool_calls") ? &body["parallel_tool_calls"] : nullptr; p && !p->is_null()) {
    if (!p->is_boolean()) return bad_request("parallel_tool_calls must be a boolean", "parallel_tool_calls");
    out.parallel = p->get<bool>();
  }
  const bool has_tools = list && !(list->is_array() && list->empty());
  if (!has_tools) {
    if (choice && !(choice->is_string() && *choice == "none")) {
      return bad_request("tool_choice needs tools", "tool_choice");
    }
    return out;
  }
  ApiResult<ordered> listed = read_tool_list(*list, body_text);
  if (auto* e = std::get_if<ApiError>(&listed)) return *e;
  const ordered& tool_list = std::get<ordered>(listed);
  out.tools_json = tool_list.dump();

  // tool_choice: "auto" when absent (OpenAI's default with tools).
  out.choice = ToolRequest::Choice::kAuto;
  if (choice) {
    if (choice->is_string()) {
      const std::string& c = choice->get_ref<const std::string&>();
      if (c == "none") {
        out.choice = ToolRequest::Choice::kNone;
      } else if (c == "required") {
        out.choice = ToolRequest::Choice::kRequired;
      } else if (c != "auto") {
        return bad_request("tool_choice must be \"none\", \"auto\", \"required\" or a named function, got " +
                               choice->dump(),
                           "tool_choice");
      }
    } else {
      const json* f = choice->is_object() && choice->contains("function") ? &(*choice)["function"] : nullptr;
      const json* name = f && f->is_object() && f->contains("name") ? &(*f)["name"] : nullptr;
      if (!name || !name->is_string()) {
        return bad_request("tool_choice must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}",
                           "tool_choice");
      }
      out.choice = ToolRequest::Choice::kNamed;
      out.named = name->get<std::string>();
    }
  }
  if (out.choice == ToolRequest::Choice::kAuto && (!tools.enable_auto_tool_choice || !tools.parser)) {
    return bad_request("\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set",
                       "tool_choice");
  }
  if (out.choice != ToolRequest::Choice::kRequired && out.choice != ToolRequest::Choice::kNamed) return out;

  // The forced forms: a JSON schema for the output, compiled like any constraint.
  ordered schema;
  if (out.choice == ToolRequest::Choice::kNamed) {
    const ordered* tool = nullptr;
    for (const ordered& t : tool_list) {
      if (t["function"]["name"] == out.named) tool = &t;
    }
    if (!tool) return bad_request("tool_choice names " + json(out.named).dump() + ", which is not in tools", "tool_choice");
    schema = parameters_of(*tool);
  } else {
    ordered calls = ordered::array();
    for (const ordered& t : tool_list) {
      ordered call;
      call["type"] = "object";
      ordered parameters = parameters_of(t);
      rebase_refs(parameters, "#/items/anyOf/" + std::to_string(calls.size()) + "/properties/parameters");
      call["properties"] = {{"name", {{"const", t["function"]["name"]}}}, {"parameters", std::move(parameters)}};
      call["required"] = {"name", "parameters"};
      call["additionalProperties"] = false;
      calls.push_back(std::move(call));
    }
    schema = {{"type", "array"}, {"minItems", 1}, {"items", {{"anyOf", std::move(calls)}}}};
    if (!out.parallel) schema["maxItems"] = 1;
  }
  if (!structured.grammars) return bad_request("tool_choice: structured outputs are not available for this model", "tool_choice");
  const bool compact = structured.config.disable_any_whitespace;
  const std::string key = std::string("tools") + (compact ? "c" : "w") + '\x1f' + schema.dump();
  auto compiled = structured.grammars->get(
      key, [&] { return structured::json_schema_grammar(schema, structured::JsonSchemaOptions{!compact}); });
  if (!compiled.ok()) return bad_request("tools: " + compiled.status().message(), "tools");
  out.constraint = GrammarConstraint{*compiled, after_token};
  return out;
}

ApiResult<std::string> read_tools_json(const json& body, std::string_view body_text) {
  const json* list = body.contains("tools") && !body["tools"].is_null() ? &body["tools"] : nullptr;
  if (!list || (list->is_array() && list->empty())) return std::string();
  ApiResult<ordered> listed = read_tool_list(*list, body_text);
  if (auto* e = std::get_if<ApiError>(&listed)) return *e;
  return std::get<ordered>(listed).dump();
}

std::vector<ParsedToolCall> forced_tool_calls(const ToolRequest& tools, std::string_view answer) {
  std::vector<ParsedToolCall> out;
  if (tools.choice == ToolRequest::Choice::kNamed) {
    // The answer is the arguments, whole or cut short, as vLLM reports it (and as it streams).
    if (!answer.empty()) out.push_back({tools.named, std::string(answer)});
    return out;
  }
  if (tools.choice != ToolRequest::Choice::kRequired) return out;
  const json j = json::parse(answer, nullptr, false);
  if (j.is_discarded() || !j.is_array()) return out;
  const std::vector<std::string_view> texts = parameter_texts(answer);
  if (texts.size() != j.size()) return out;
  for (size_t i = 0; i < j.size(); ++i) {
    const json& call = j[i];
    if (!call.is_object() || !call.contains("name") || !call["name"].is_string()) return {};
    out.push_back({call["name"].get<std::string>(), std::string(texts[i])});
  }
  return out;
}

}  // namespace pagoda::server
