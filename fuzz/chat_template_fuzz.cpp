// Chat templates: the input is a template source, a NUL byte, then messages as role \x01 content
// \x02 pairs, the last byte of the template part choosing the options. Parsing and rendering
// either fail with a message or give text within the limits; neither may crash or hang (the
// step and loop limits are lowered so that one input stays fast).
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "tokenizer/chat_template.h"

using namespace pagoda;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::Input in(data, size);
  const std::string_view source = in.take_until('\0');
  std::vector<ChatMessage> messages;
  while (!in.empty() && messages.size() < 64) {
    ChatMessage m;
    m.role = std::string(in.take_until('\x01'));
    m.content = std::string(in.take_until('\x02'));
    if (m.role == "assistant" && m.content.size() % 2 == 1) m.reasoning_content = "thinking";
    messages.push_back(std::move(m));
  }
  auto tmpl = ChatTemplate::parse(source);
  if (!tmpl.ok()) {
    FUZZ_CHECK(!tmpl.status().message().empty());
    return 0;
  }
  ChatTemplateOptions options;
  const uint8_t flags = source.empty() ? 0 : static_cast<uint8_t>(source.back());
  options.add_generation_prompt = (flags & 1) != 0;
  options.bos_token = "<s>";
  options.eos_token = "</s>";
  if ((flags & 2) != 0) options.flags["enable_thinking"] = (flags & 4) != 0;
  options.limits.max_output_bytes = 1 << 16;
  options.limits.max_loop_iterations = 10000;
  options.limits.max_steps = 100000;
  auto text = tmpl.value().apply(messages, options);
  if (!text.ok()) {
    FUZZ_CHECK(!text.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(static_cast<int64_t>(text.value().size()) <= options.limits.max_output_bytes);
  return 0;
}
