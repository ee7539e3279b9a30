// The OpenAI protocol end to end, without a socket: a request body (completions, chat, /tokenize
// or /detokenize; stories260K's SentencePiece vocabulary or Qwen3's byte-level BPE and chat
// template) is parsed; an accepted request is answered with output chunks whose texts come from
// the rest of the input, both streamed and not.
//
// Input: byte 0 picks the model and endpoint; the body runs to the first NUL; what follows is
// split at \x03 into the output texts (invalid UTF-8 replaced, as the engine only emits whole
// characters). Checks: a refused body gets a 400/404 whose JSON is valid; an accepted one has
// prompts inside the vocabulary and the context; every SSE event is "data: " + valid UTF-8 JSON
// (or [DONE]) + a blank line; per choice, the streamed text concatenates to the non-streamed
// response's text.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "fuzz_support.h"
#include "loader/gguf_file.h"
#include "server/openai_request.h"
#include "server/openai_response.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

using namespace pagoda;
using namespace pagoda::server;
using nlohmann::json;

namespace {

struct Served {
  std::unique_ptr<GgufFile> gguf;
  std::unique_ptr<Tokenizer> tok;
  std::optional<ChatTemplate> tmpl;
  ModelContext ctx;
};

std::vector<std::unique_ptr<Served>>& models() {
  static std::vector<std::unique_ptr<Served>> m;
  return m;
}

void load_models() {
  const std::string stories = fuzz::find_model_file("stories260K/stories260K.gguf");
  if (!stories.empty()) {
    auto s = std::make_unique<Served>();
    auto gguf = GgufFile::open(stories);
    FUZZ_CHECK(gguf.ok());
    s->gguf = std::move(gguf).value();
    auto tok = load_gguf_tokenizer(*s->gguf);
    FUZZ_CHECK(tok.ok());
    s->tok = std::move(tok).value();
    s->ctx.served_model_names = {"stories"};
    s->ctx.max_model_len = 64;
    s->ctx.tokenizer = s->tok.get();
    models().push_back(std::move(s));
  }
  const std::string qwen = fuzz::find_model_file("tokenizers/qwen3/tokenizer.json");
  const std::string qwen_config = fuzz::find_model_file("tokenizers/qwen3/tokenizer_config.json");
  if (!qwen.empty() && !qwen_config.empty()) {
    auto s = std::make_unique<Served>();
    auto tok = load_hf_tokenizer(qwen.substr(0, qwen.rfind('/')));
    FUZZ_CHECK(tok.ok());
    s->tok = std::move(tok).value();
    auto config = load_chat_template_from_hf_config(qwen_config);
    FUZZ_CHECK(config.ok());
    auto tmpl = ChatTemplate::parse(config.value().chat_template);
    FUZZ_CHECK(tmpl.ok());
    s->tmpl = std::move(tmpl).value();
    s->ctx.served_model_names = {"qwen3", "qwen"};
    s->ctx.max_model_len = 256;
    s->ctx.tokenizer = s->tok.get();
    s->ctx.chat_template = &*s->tmpl;
    s->ctx.bos_token = config.value().bos_token;
    s->ctx.eos_token = config.value().eos_token;
    models().push_back(std::move(s));
  }
}

// Whole characters only: each invalid byte becomes '?'.
std::string whole_characters(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 1;
    for (size_t l = 4; l >= 2; --l) {
      if (i + l <= s.size() && fuzz::is_valid_utf8(s.substr(i, l))) {
        len = l;
        break;
      }
    }
    if (len == 1 && static_cast<unsigned char>(s[i]) >= 0x80) {
      out += '?';
    } else {
      out.append(s.substr(i, len));
    }
    i += len;
  }
  return out;
}

// The text a choice object carries: completions "text", chat "message.content" or
// "delta.content" (absent or null: none).
std::string choice_text(const json& choice, bool chat, bool streamed) {
  const json* holder = &choice;
  if (chat) {
    const char* key = streamed ? "delta" : "message";
    if (!choice.contains(key)) return "";
    holder = &choice[key];
    if (!holder->contains("content") || !(*holder)["content"].is_string()) return "";
    return (*holder)["content"].get<std::string>();
  }
  FUZZ_CHECK(choice.contains("text") && choice["text"].is_string());
  return choice["text"].get<std::string>();
}

void check_response(const ParsedRequest& p, const ModelContext& ctx, std::vector<std::string> texts,
                    uint8_t finish) {
  const bool chat = p.endpoint == Endpoint::kChat;
  ResponseBuilder streamed(p, *ctx.tokenizer, "id-1", 0);
  ResponseBuilder whole(p, *ctx.tokenizer, "id-1", 0);
  std::map<int64_t, std::string> streamed_text;  // by choice index
  std::string events;
  const auto vocab = static_cast<TokenId>(ctx.tokenizer->vocab_size());
  if (texts.empty()) texts.push_back("");
  for (size_t k = 0; k < p.prompts.size(); ++k) {
    for (int64_t i = 0; i < p.n; ++i) {
      for (size_t t = 0; t < texts.size(); ++t) {
        OutputChunk c;
        c.index = i;
        c.text = texts[t];
        c.token_ids = {static_cast<TokenId>((t * 7 + 3) % static_cast<size_t>(vocab))};
        if (p.logprobs) {
          SampledOutput s;
          s.token = c.token_ids[0];
          s.logprob = t % 3 == 0 ? -__builtin_inff() : -0.25f * static_cast<float>(t);
          for (int64_t j = 0; j < *p.logprobs; ++j)
            s.top_logprobs.push_back({static_cast<TokenId>(j % vocab), -1.0f});
          c.logprobs = {s};
        }
        if (t + 1 == texts.size()) {
          c.finish_reason = finish % 2 == 0 ? FinishReason::kLength : FinishReason::kStop;
          if (finish % 4 == 1) c.stop_string = "\xE2\x80\x94stop";
          c.prompt_tokens = static_cast<int64_t>(p.prompts[k].prompt_token_ids.size());
          c.completion_tokens = static_cast<int64_t>(texts.size());
        }
        events += streamed.stream_events(k, c);
        whole.add(k, c);
      }
    }
  }
  FUZZ_CHECK(streamed.all_finished() && whole.all_finished());
  events += streamed.stream_end();

  // Every event: "data: <payload>\n\n", valid UTF-8; the payload JSON or [DONE] (last).
  size_t pos = 0;
  bool done = false;
  while (pos < events.size()) {
    FUZZ_CHECK(!done);
    FUZZ_CHECK(events.compare(pos, 6, "data: ") == 0);
    const size_t end = events.find("\n\n", pos);
    FUZZ_CHECK(end != std::string::npos);
    const std::string payload = events.substr(pos + 6, end - pos - 6);
    FUZZ_CHECK(payload.find('\n') == std::string::npos);
    FUZZ_CHECK(fuzz::is_valid_utf8(payload));
    pos = end + 2;
    if (payload == "[DONE]") {
      done = true;
      continue;
    }
    const json event = json::parse(payload, nullptr, false);
    FUZZ_CHECK(!event.is_discarded() && event.contains("choices") && event["choices"].is_array());
    for (const json& choice : event["choices"]) {
      streamed_text[choice["index"].get<int64_t>()] += choice_text(choice, chat, true);
    }
  }
  FUZZ_CHECK(done);

  const std::string body = whole.body();
  FUZZ_CHECK(fuzz::is_valid_utf8(body));
  const json response = json::parse(body, nullptr, false);
  FUZZ_CHECK(!response.is_discarded() && response["choices"].is_array());
  FUZZ_CHECK(response["choices"].size() == p.prompts.size() * static_cast<size_t>(p.n));
  for (const json& choice : response["choices"]) {
    FUZZ_CHECK(choice_text(choice, chat, false) == streamed_text[choice["index"].get<int64_t>()]);
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  load_models();
  fuzz::require_test_data("openai_request_fuzz", models().size() == 2);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (models().empty()) return 0;
  fuzz::Input in(data, size);
  const uint8_t pick = in.take_byte();
  const Served& m = *models()[(pick >> 2) % models().size()];
  const std::string_view body = in.take_until('\0');
  std::vector<std::string> texts;
  while (!in.empty()) texts.push_back(whole_characters(in.take_until('\x03')));
  const uint8_t finish = texts.empty() ? 0 : static_cast<uint8_t>(texts.size());

  if ((pick & 3) >= 2) {  // /tokenize, /detokenize
    const ApiResult<std::string> r =
        (pick & 3) == 2 ? handle_tokenize(body, m.ctx) : handle_detokenize(body, m.ctx);
    if (const std::string* out = std::get_if<std::string>(&r)) {
      FUZZ_CHECK(fuzz::is_valid_utf8(*out) && !json::parse(*out, nullptr, false).is_discarded());
    } else {
      const ApiError& e = std::get<ApiError>(r);
      FUZZ_CHECK(e.status == 400 || e.status == 404);
      FUZZ_CHECK(!json::parse(e.to_json(), nullptr, false).is_discarded());
    }
    return 0;
  }
  const bool chat = (pick & 1) != 0;
  const ApiResult<ParsedRequest> r =
      chat ? parse_chat_request(body, m.ctx) : parse_completion_request(body, m.ctx);
  if (const ApiError* e = std::get_if<ApiError>(&r)) {
    FUZZ_CHECK(e->status == 400 || e->status == 404);
    const std::string error = e->to_json();
    FUZZ_CHECK(fuzz::is_valid_utf8(error) && !json::parse(error, nullptr, false).is_discarded());
    FUZZ_CHECK(!stream_error_events(*e).empty());
    return 0;
  }
  const ParsedRequest& p = std::get<ParsedRequest>(r);
  FUZZ_CHECK(!p.prompts.empty() && p.n >= 1 && p.prompts.size() == p.prompt_texts.size());
  for (const GenerateRequest& g : p.prompts) {
    FUZZ_CHECK(!g.prompt_token_ids.empty());
    for (TokenId id : g.prompt_token_ids) FUZZ_CHECK(id >= 0 && id < m.tok->vocab_size());
    FUZZ_CHECK(static_cast<int64_t>(g.prompt_token_ids.size()) + g.params.max_tokens <=
               m.ctx.max_model_len);
    FUZZ_CHECK(g.params.validate(m.tok->vocab_size()).ok());
  }
  check_response(p, m.ctx, std::move(texts), finish);
  return 0;
}
