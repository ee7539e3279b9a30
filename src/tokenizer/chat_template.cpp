// The public face of the Jinja interpreter (jinja_parser.cpp, jinja_interpreter.cpp): builds
// the template variables from a conversation and turns the interpreter's exceptions, which
// never leave this file, into Status values.
#include "tokenizer/chat_template.h"

#include <algorithm>
#include <fstream>
#include <new>
#include <nlohmann/json.hpp>
#include <sstream>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/ordered_json.h"
#include "tokenizer/unicode.h"
#include "tokenizer/vocab_tokenizer.h"

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

namespace {

// A JSON value as the template sees it (Python's json.loads: objects keep their keys' order).
jinja::Value from_json(const nlohmann::ordered_json& j) {
  using jinja::Value;
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return j.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX) ? Value(static_cast<int64_t>(j.get<uint64_t>()))
                                                                   : Value(j.get<double>());
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      jinja::List list;
      for (const auto& e : j) list.push_back(from_json(e));
      return Value(std::move(list));
    }
    case nlohmann::ordered_json::value_t::object: {
      jinja::Dict d;
      for (auto it = j.begin(); it != j.end(); ++it) d.emplace_back(Value(it.key()), from_json(it.value()));
      return Value(std::move(d));
    }
    default: return Value::none();
  }
}

// JSON text (its depth bounded by the caller) as a template value, its objects' keys in order;
// text that does not parse, or holds more than 20,000 keys, is a string.
jinja::Value from_json_text(const std::string& text) {
  const std::optional<nlohmann::ordered_json> j = parse_ordered_json(text, 20000);
  return j ? from_json(*j) : jinja::Value(text);
}

}  // namespace

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
      if (!m.tool_calls.empty()) {
        jinja::List calls;
        for (const ChatToolCall& c : m.tool_calls) {
          jinja::Dict function;
          function.emplace_back(Value("name"), Value(c.name));
          function.emplace_back(Value("arguments"), from_json_text(c.arguments));
          jinja::Dict call;
          call.emplace_back(Value("id"), Value(c.id));
          call.emplace_back(Value("type"), Value("function"));
          call.emplace_back(Value("function"), Value(std::move(function)));
          calls.emplace_back(std::move(call));
        }
        d.emplace_back(Value("tool_calls"), Value(std::move(calls)));
      }
      if (!m.tool_call_id.empty()) d.emplace_back(Value("tool_call_id"), Value(m.tool_call_id));
      list.emplace_back(std::move(d));
    }
    std::vector<std::pair<std::string, Value>> globals;
    globals.emplace_back("messages", Value(std::move(list)));
    if (!options.tools_json.empty()) globals.emplace_back("tools", from_json_text(options.tools_json));
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
    if (e.raised) {
      // The template's own words reach the client; an empty raise still has to say something.
      return invalid_argument(e.message.empty() ? "chat template: raise_exception with an empty message"
                                                : e.message);
    }
    if (e.exhausted) return resource_exhausted("chat template: " + e.message);
    return invalid_argument("chat template " + e.message);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("chat template: out of memory while rendering");
  }
}

// ---- encode_chat ---------------------------------------------------------------------------

namespace {

// A placeholder is kMark followed by two digits (base kRadix) that index the special texts.
constexpr char32_t kMark = 0xE000;
constexpr char32_t kFirstDigit = 0xE100;
constexpr size_t kRadix = 4096;  // the digits stay inside the private-use block U+E000..U+F8FF
constexpr std::string_view kMarkUtf8 = "\xEE\x80\x80";
constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

void append_placeholder(size_t index, std::string& out) {
  unicode::append_utf8(kMark, out);
  unicode::append_utf8(kFirstDigit + static_cast<char32_t>(index / kRadix), out);
  unicode::append_utf8(kFirstDigit + static_cast<char32_t>(index % kRadix), out);
}

// The value of the digit at text[pos], or -1.
int64_t read_digit(std::string_view text, size_t& pos) {
  if (pos >= text.size()) return -1;
  const unicode::Utf8Step step = unicode::decode_utf8(text, pos);
  if (!step.valid || step.code_point < kFirstDigit || step.code_point >= kFirstDigit + kRadix) return -1;
  pos += step.length;
  return static_cast<int64_t>(step.code_point - kFirstDigit);
}

// `field` with each special text replaced by its placeholder and any U+E000 by U+FFFD.
std::string hide_special_texts(std::string_view field, const LiteralMatcher& specials) {
  std::string out;
  out.reserve(field.size());
  for (const LiteralMatcher::Piece& piece : specials.split(field)) {
    if (piece.id >= 0) {
      append_placeholder(static_cast<size_t>(piece.id), out);
      continue;
    }
    for (size_t pos = 0; pos < piece.text.size();) {
      const size_t mark = piece.text.find(kMarkUtf8, pos);
      out.append(piece.text.substr(pos, mark == std::string_view::npos ? mark : mark - pos));
      if (mark == std::string_view::npos) break;
      out.append(kReplacementUtf8);
      pos = mark + kMarkUtf8.size();
    }
  }
  return out;
}

bool has_special_text(std::string_view field, const LiteralMatcher& specials) {
  for (const LiteralMatcher::Piece& piece : specials.split(field)) {
    if (piece.id >= 0) return true;
  }
  return false;
}

}  // namespace

Result<ChatPrompt> encode_chat(const ChatTemplate& tmpl, const Tokenizer& tok,
                               const std::vector<ChatMessage>& messages,
                               const ChatTemplateOptions& options) {
  const std::vector<std::string> special_texts = tok.special_token_texts();
  LiteralMatcher specials;
  // Two digits name at most kRadix^2 texts; no real vocabulary comes near that.
  for (size_t i = 0; i < std::min(special_texts.size(), kRadix * kRadix); ++i) {
    specials.add(special_texts[i], static_cast<TokenId>(i));
  }
  bool any_special = has_special_text(options.tools_json, specials);
  for (const ChatMessage& m : messages) {
    any_special = any_special || has_special_text(m.content, specials) ||
                  has_special_text(m.reasoning_content, specials);
    for (const ChatToolCall& c : m.tool_calls) {
      any_special = any_special || has_special_text(c.name, specials) || has_special_text(c.arguments, specials);
    }
  }
  ChatPrompt prompt;
  if (!any_special) {
    PAGODA_ASSIGN_OR_RETURN(prompt.text, tmpl.apply(messages, options));
    prompt.ids = tok.encode(prompt.text, /*add_special=*/false);
    return prompt;
  }

  std::vector<ChatMessage> hidden = messages;
  for (ChatMessage& m : hidden) {
    m.content = hide_special_texts(m.content, specials);
    m.reasoning_content = hide_special_texts(m.reasoning_content, specials);
    for (ChatToolCall& c : m.tool_calls) {
      c.name = hide_special_texts(c.name, specials);
      c.arguments = hide_special_texts(c.arguments, specials);
    }
  }
  ChatTemplateOptions hidden_options = options;
  hidden_options.tools_json = hide_special_texts(options.tools_json, specials);
  PAGODA_ASSIGN_OR_RETURN(std::string rendered, tmpl.apply(hidden, hidden_options));
  // Put the texts back, remembering where they went: those bytes came from messages.
  std::vector<TextRange> verbatim;
  prompt.text.reserve(rendered.size());
  for (size_t pos = 0; pos < rendered.size();) {
    const size_t mark = rendered.find(kMarkUtf8, pos);
    prompt.text.append(rendered, pos, mark == std::string::npos ? std::string::npos : mark - pos);
    if (mark == std::string::npos) break;
    pos = mark + kMarkUtf8.size();
    const int64_t high = read_digit(rendered, pos);
    const int64_t low = high < 0 ? -1 : read_digit(rendered, pos);
    const int64_t index = high * static_cast<int64_t>(kRadix) + low;
    if (high < 0 || low < 0 || index >= static_cast<int64_t>(special_texts.size())) {
      prompt.text.append(kReplacementUtf8);  // a placeholder the template cut apart
      continue;
    }
    const std::string& text = special_texts[static_cast<size_t>(index)];
    verbatim.push_back({prompt.text.size(), prompt.text.size() + text.size()});
    prompt.text.append(text);
  }
  prompt.ids = tok.encode(prompt.text, /*add_special=*/false, verbatim);
  return prompt;
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
