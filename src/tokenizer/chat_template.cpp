// The public face of the Jinja interpreter (jinja_parser.cpp, jinja_interpreter.cpp): builds
// the template variables from a conversation and turns the interpreter's exceptions, which
// never leave this file, into Status values.
#include "tokenizer/chat_template.h"

#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/jinja_ast.h"

namespace pagoda {

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  ChatTemplate t;
  t.source_ = std::string(source);
  try {
    t.body_ = std::make_shared<const jinja::Body>(jinja::parse_template(t.source_));
  } catch (const jinja::ParseError& e) {
    return invalid_argument("chat template " + std::to_string(e.line) + ":" + std::to_string(e.col) + ": " +
                            e.message);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("chat template: out of memory while parsing");
  }
  return t;
}

Result<std::string> ChatTemplate::apply(const std::vector<ChatMessage>& messages,
                                        const ChatTemplateOptions& options) const {
  using jinja::Value;
  try {
    jinja::List list;
    for (const ChatMessage& m : messages) {
      jinja::Dict d;
      d.emplace_back(Value("role"), Value(m.role));
      d.emplace_back(Value("content"), Value(m.content));
      if (!m.reasoning_content.empty())
        d.emplace_back(Value("reasoning_content"), Value(m.reasoning_content));
      list.emplace_back(std::move(d));
    }
    std::vector<std::pair<std::string, Value>> globals;
    globals.emplace_back("messages", Value(std::move(list)));
    globals.emplace_back("add_generation_prompt", Value(options.add_generation_prompt));
    globals.emplace_back("bos_token", Value(options.bos_token));
    globals.emplace_back("eos_token", Value(options.eos_token));
    for (const auto& [name, flag] : options.flags) globals.emplace_back(name, Value(flag));
    jinja::Limits limits;
    limits.max_output_bytes = options.limits.max_output_bytes;
    limits.max_loop_iterations = options.limits.max_loop_iterations;
    limits.max_call_depth = options.limits.max_call_depth;
    limits.max_steps = options.limits.max_steps;
    return jinja::render_template(*body_, globals, limits);
  } catch (const jinja::RenderError& e) {
    if (e.raised) return invalid_argument(e.message);
    if (e.exhausted) return resource_exhausted("chat template: " + e.message);
    return invalid_argument("chat template " + e.message);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("chat template: out of memory while rendering");
  }
}

namespace {

std::string token_string(const nlohmann::json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return "";
}

}  // namespace

Result<HfChatTemplateConfig> load_chat_template_from_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return io_error(path + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(buffer.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return data_loss(path + ": not a JSON object");
  HfChatTemplateConfig config;
  if (j.contains("bos_token")) config.bos_token = token_string(j["bos_token"]);
  if (j.contains("eos_token")) config.eos_token = token_string(j["eos_token"]);
  const nlohmann::json* t = j.contains("chat_template") ? &j["chat_template"] : nullptr;
  if (t && t->is_string()) {
    config.chat_template = t->get<std::string>();
    return config;
  }
  if (t && t->is_array()) {
    for (const nlohmann::json& entry : *t) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string()) {
        config.chat_template = entry["template"].get<std::string>();
        return config;
      }
    }
    return not_found(path + ": chat_template has no entry named \"default\"");
  }
  return not_found(path + ": no chat_template");
}

}  // namespace pagoda
