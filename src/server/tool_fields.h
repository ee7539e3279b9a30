// The tool-calling fields of a chat request, as vLLM takes them: tools, tool_choice and
// parallel_tool_calls.
//
//   tools        [{"type": "function", "function": {"name", "description", "parameters",
//                "strict"}}]: handed to the chat template as `tools` (keys in their order)
//   tool_choice  "none": the model may not call (the template still sees the tools, as in vLLM);
//                "auto" (the default with tools): the tool-call parser (--tool-call-parser, with
//                --enable-auto-tool-choice) reads the calls the model chose to write;
//                "required", or {"type": "function", "function": {"name"}}: the output is
//                constrained by a grammar, so that it always parses: for a named function, its
//                arguments object (its `parameters` schema); for required, a JSON array of one
//                or more {"name", "parameters"} calls (one only with parallel_tool_calls false).
// These forced forms need no tool parser: the server reads the JSON the grammar made
// (forced_tool_calls).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine_types.h"
#include "server/openai_common.h"
#include "server/output_parsers.h"
#include "server/structured_fields.h"

namespace pagoda::server {

// How a chat request's answer is to be read for tool calls.
struct ToolRequest {
  enum class Choice { kNone, kAuto, kRequired, kNamed };
  Choice choice = Choice::kNone;
  std::string tools_json;  // the tools for the template; "" without tools
  std::string named;       // kNamed: the function
  bool parallel = true;    // parallel_tool_calls
  std::optional<GrammarConstraint> constraint;  // kRequired, kNamed
};

// What reading tools needs from the server.
struct ToolContext {
  const ToolParser* parser = nullptr;  // --tool-call-parser
  bool enable_auto_tool_choice = false;
};

// From a chat body (`body_text` as received, read again with its order kept). Errors name the
// field: a malformed tool, a tool_choice naming no tool, "auto" without the server's flags,
// tool_choice without tools, a schema the compiler refuses.
ApiResult<ToolRequest> read_tools(const nlohmann::json& body, std::string_view body_text, const ToolContext& tools,
                                  const StructuredContext& structured, std::optional<TokenId> after_token);

// Only the tools' JSON text for the template (a checked list; "" without tools): what rendering
// alone needs (/tokenize with messages).
ApiResult<std::string> read_tools_json(const nlohmann::json& body, std::string_view body_text);

// The calls in the output of a request whose tool_choice was required or named (the grammar made
// it): named: the whole answer (if any) is the arguments, as vLLM has it; required: the array's
// elements, each call's parameters as written. Required gives none when the output is not what the
// grammar makes (cut short by max_tokens).
std::vector<ParsedToolCall> forced_tool_calls(const ToolRequest& tools, std::string_view answer);

}  // namespace pagoda::server
