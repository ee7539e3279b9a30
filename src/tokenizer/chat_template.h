// ChatTemplate: turns a conversation into the prompt text a chat model expects, by rendering
// the Jinja template the model ships in its tokenizer_config.json ("chat_template"), the same
// way Hugging Face's apply_chat_template does (Jinja2 with trim_blocks and lstrip_blocks,
// raise_exception, strftime_now, and a tojson filter that calls json.dumps).
//
// Sits in tokenizer/; the server and the chat app call it before Tokenizer::encode. A parsed
// ChatTemplate is immutable and apply() is thread-safe.
//
// Templates are untrusted input: parse() and apply() fail with a Status on anything malformed
// and never crash or hang. A render is capped (ChatTemplateLimits) at 1 MiB of output and per
// string, 1e6 loop iterations and macro calls, 64 nested macro calls, 1e7 evaluation steps and
// 256 MiB of produced data; there is no file, environment or network access from a template.
//
// The supported language (a subset of Jinja2 that covers the templates models ship):
//   {{ }}, {% %}, {# #}, '-' and '+' whitespace markers, {% raw %};
//   if/elif/else, for (loop.index/index0/revindex/first/last/length/previtem/nextitem/cycle,
//   `for a, b in ...`, `for x in xs if cond`, else, break, continue), set (also
//   `set ns.attr = ...` on namespace() objects, tuple unpacking, {% set x %}...{% endset %}),
//   macro (with defaults; it sees the template's top-level variables), {% generation %};
//   literals (strings with Python escapes, ints, floats, true/false/none, lists, tuples,
//   dicts), + - * / // % ** ~, comparisons (chained), and/or/not, in/not in, `a if c else b`,
//   attributes, subscripts with negative indices, slices with steps;
//   filters: trim length count upper lower capitalize title string safe escape tojson first
//   last join default/d replace int float abs round list items reverse unique sort min max
//   sum indent select reject selectattr rejectattr map dictsort;
//   tests: defined undefined none string mapping iterable sequence number integer float
//   boolean true false callable lower upper odd even divisibleby eq/equalto ne lt le gt ge
//   in sameas;
//   string methods startswith endswith strip lstrip rstrip split rsplit replace upper lower
//   title capitalize find count join; dict methods items keys values get;
//   functions range, namespace, dict, raise_exception, strftime_now.
// Not supported: extends/include/import/block, call blocks, filter blocks, recursive loops,
// `*args`, string % formatting and str.format, list/dict mutation methods.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "tokenizer/tokenizer.h"

namespace pagoda {

namespace jinja {
struct Stmt;
}

// One message of a conversation. Content-part arrays are flattened to text by the caller.
// A tool call of an assistant turn, as OpenAI's messages carry it.
struct ChatToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object's text
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
  // An assistant turn's reasoning; the template sees message.reasoning_content only when this
  // is not empty (otherwise the key is absent, i.e. undefined).
  std::string reasoning_content;
  // An assistant turn's calls: message.tool_calls, each {"id", "type": "function", "function":
  // {"name", "arguments"}} with the arguments as a mapping (they are sent as JSON text, and
  // templates write them with tojson, as vLLM hands them over). Absent when empty.
  std::vector<ChatToolCall> tool_calls = {};
  std::string tool_call_id = {};  // a tool turn's: message.tool_call_id when not empty
};

// What one apply() may spend before it fails with resource_exhausted.
struct ChatTemplateLimits {
  int64_t max_output_bytes = 1 << 20;     // the rendered text, and any one string value
  int64_t max_loop_iterations = 1000000;  // loop iterations and macro calls, all together
  int max_call_depth = 64;                // nested macro calls
  int64_t max_steps = 10000000;           // statements and expressions evaluated
};

struct ChatTemplateOptions {
  bool add_generation_prompt = true;  // end with the header of the assistant's next turn
  std::string bos_token, eos_token;   // the template's bos_token / eos_token variables
  // Extra template variables such as enable_thinking (Qwen3); absent ones are undefined.
  std::map<std::string, bool> flags;
  // The request's tools as a JSON array's text (OpenAI's [{"type": "function", "function": {...}}]),
  // which the template sees as `tools` with its keys in their order; "" leaves `tools` undefined.
  std::string tools_json;
  ChatTemplateLimits limits;
};

class ChatTemplate {
 public:
  // Parses a template. Syntax errors fail with invalid_argument "chat template line:col: ...".
  static Result<ChatTemplate> parse(std::string_view source);

  // Renders `messages` (the template sees `messages`, `add_generation_prompt`, `bos_token`,
  // `eos_token` and each flag). Fails with invalid_argument: with the template's own message
  // verbatim when it calls raise_exception(message) (e.g. roles that do not alternate), or
  // "chat template line:col: ..." for an error in the template; resource_exhausted when a
  // limit above is hit.
  Result<std::string> apply(const std::vector<ChatMessage>& messages,
                            const ChatTemplateOptions& options) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::shared_ptr<const std::vector<std::unique_ptr<jinja::Stmt>>> body_;
};

// A rendered conversation and its token ids.
struct ChatPrompt {
  std::string text;          // the template's output, as the model sees it
  std::vector<TokenId> ids;  // text tokenized as described at encode_chat()
};

// Renders `messages` with tmpl.apply() and tokenizes the result with add_special = false (the
// template writes BOS itself where the model wants one, as vLLM assumes).
//
// Special-token text that a message field (content, reasoning_content) contains, such as a
// user writing "<|im_start|>system\n...<|im_end|>", stays plain text: it never becomes the
// control tokens, while the same text written by the template (its role headers, bos_token,
// eos_token) does. Added tokens that are not special (Qwen3's <think>) are recognized in
// messages as in the template, as Hugging Face tokenizers do.
//
// How: when no field contains any of tok.special_token_texts(), the text is simply
// tok.encode(text, false). Otherwise each occurrence in a field is first replaced by a
// placeholder of Unicode private-use characters (U+E000 followed by two characters of
// U+E100..U+F0FF naming the token), the conversation is rendered, every placeholder in the
// output is turned back into its text, and those byte ranges are passed to encode() as
// verbatim. So that a user cannot forge a placeholder, U+E000 written in any field is replaced
// by U+FFFD in this case (only U+E000 starts a placeholder; the other private-use characters
// are left alone). A template that cuts a placeholder apart (slicing the content) leaves
// U+FFFD where the cut one stood. Templates are assumed not to write U+E000 themselves.
//
// Fails as ChatTemplate::apply() does.
Result<ChatPrompt> encode_chat(const ChatTemplate& tmpl, const Tokenizer& tok,
                               const std::vector<ChatMessage>& messages,
                               const ChatTemplateOptions& options);

// What a Hugging Face tokenizer_config.json says about chat formatting.
struct HfChatTemplateConfig {
  std::string chat_template;         // the template source
  std::string bos_token, eos_token;  // "" where the file has none
};

// Reads `tokenizer_config_path`: "chat_template" is a string, or a list of {name, template}
// from which the one named "default" is taken; bos_token / eos_token are strings or
// {"content": ...} objects. Fails with io_error when the file cannot be read, data_loss when it
// is not valid JSON, and not_found when it has no chat template.
Result<HfChatTemplateConfig> load_chat_template_from_hf_config(const std::string& tokenizer_config_path);

}  // namespace pagoda
