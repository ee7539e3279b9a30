// The OpenAI protocol layer on real tokenizers: every bad input of the reliability checklist's
// JSON, parameter and chat rows (4.2, 4.3, 4.4) comes back as the exact OpenAI error object;
// valid bodies map field for field onto GenerateRequest; responses and SSE chunks have OpenAI's
// (and vLLM's) shapes; and a mutation fuzz of valid bodies never crashes (this binary runs
// under ASan and UBSan).
#include "server/openai_request.h"
#include "server/openai_response.h"

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "loader/gguf_file.h"
#include "server/output_parsers.h"
#include "structured/grammar_matcher.h"
#include "support/test_data.h"

namespace pagoda::server {
namespace {

using nlohmann::json;

// ---- fixtures: stories260K (SentencePiece, 512 tokens) and Qwen3 (byte-level BPE + template) ----

struct Model {
  std::unique_ptr<GgufFile> gguf;  // the tokenizer was read from it
  std::unique_ptr<Tokenizer> tok;
  std::optional<ChatTemplate> tmpl;
  std::unique_ptr<structured::GrammarCompiler> grammars;
  ModelContext ctx;
};

// Structured outputs for `m`, over its tokenizer's vocabulary.
void add_grammars(Model& m) {
  m.grammars = std::make_unique<structured::GrammarCompiler>(structured::TokenVocabulary::of(*m.tok, m.tok->vocab_size()));
  m.ctx.structured.grammars = m.grammars.get();
}

const Model* stories() {
  static Model m;
  if (m.tok) return &m;
  const std::string path = ::pagoda::testing::find_test_file("stories260K/stories260K.gguf");
  if (path.empty()) return nullptr;
  auto gguf = GgufFile::open(path);
  EXPECT_TRUE(gguf.ok()) << gguf.status().message();
  if (!gguf.ok()) return nullptr;
  m.gguf = std::move(gguf).value();
  auto tok = load_gguf_tokenizer(*m.gguf);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!tok.ok()) return nullptr;
  m.tok = std::move(tok).value();
  m.ctx.served_model_names = {"stories", "stories-alias"};
  m.ctx.max_model_len = 64;
  m.ctx.tokenizer = m.tok.get();
  add_grammars(m);
  return &m;
}

const Model* qwen3() {
  static Model m;
  if (m.tok) return &m;
  const std::string json_path = ::pagoda::testing::find_test_file("tokenizers/qwen3/tokenizer.json");
  const std::string config = ::pagoda::testing::find_test_file("tokenizers/qwen3/tokenizer_config.json");
  if (json_path.empty() || config.empty()) return nullptr;
  auto tok = load_hf_tokenizer(json_path.substr(0, json_path.rfind('/')));
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  auto c = load_chat_template_from_hf_config(config);
  EXPECT_TRUE(c.ok()) << c.status().message();
  if (!tok.ok() || !c.ok()) return nullptr;
  auto t = ChatTemplate::parse(c->chat_template);
  EXPECT_TRUE(t.ok()) << t.status().message();
  if (!t.ok()) return nullptr;
  m.tok = std::move(tok).value();
  m.tmpl = std::move(t).value();
  m.ctx.served_model_names = {"qwen3"};
  m.ctx.max_model_len = 256;
  m.ctx.tokenizer = m.tok.get();
  m.ctx.chat_template = &*m.tmpl;
  m.ctx.bos_token = c->bos_token;
  m.ctx.eos_token = c->eos_token;
  add_grammars(m);
  return &m;
}

#define PAGODA_STORIES(var)                                     \
  PAGODA_TEST_FILE(var##_path, "stories260K/stories260K.gguf"); \
  const Model* var = stories();                                 \
  ASSERT_NE(var, nullptr)

#define PAGODA_QWEN3(var)                                                   \
  PAGODA_TEST_FILE(var##_json, "tokenizers/qwen3/tokenizer.json");          \
  PAGODA_TEST_FILE(var##_config, "tokenizers/qwen3/tokenizer_config.json"); \
  const Model* var = qwen3();                                               \
  ASSERT_NE(var, nullptr)

// ---- helpers --------------------------------------------------------------------------------------

template <typename T>
const T* ok_value(const ApiResult<T>& r) {
  return std::get_if<T>(&r);
}
template <typename T>
const T* ok_value(ApiResult<T>&& r) = delete;  // would dangle

// The accepted request, by value.
template <typename T>
std::optional<T> accepted(ApiResult<T> r) {
  if (T* v = std::get_if<T>(&r)) return std::move(*v);
  return std::nullopt;
}

// The error's fields, and that to_json() is the OpenAI object carrying exactly them.
template <typename T>
::testing::AssertionResult is_error(const ApiResult<T>& r, const std::string& param, const std::string& code = "",
                                    int status = 400, const std::string& type = "invalid_request_error") {
  const ApiError* e = std::get_if<ApiError>(&r);
  if (!e) return ::testing::AssertionFailure() << "accepted";
  auto fail = [&] {
    return ::testing::AssertionFailure() << "got " << e->status << " " << e->type << " param='" << e->param
                                         << "' code='" << e->code << "': " << e->message;
  };
  if (e->status != status || e->type != type || e->param != param || e->code != code || e->message.empty()) {
    return fail();
  }
  json j = json::parse(e->to_json(), nullptr, false);
  if (j.is_discarded() || !j.contains("error")) return fail() << " (bad JSON)";
  const json& o = j["error"];
  if (o.size() != 4 || o["type"] != type || !o["message"].is_string() ||
      (param.empty() ? !o["param"].is_null() : o["param"] != param) ||
      (code.empty() ? !o["code"].is_null() : o["code"] != code)) {
    return fail() << " (JSON " << e->to_json() << ")";
  }
  return ::testing::AssertionSuccess();
}

std::string error_message(const ApiResult<ParsedRequest>& r) {
  const ApiError* e = std::get_if<ApiError>(&r);
  return e ? e->message : "";
}

std::string repeat(const std::string& s, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += s;
  return out;
}

// The JSON objects of the "data: ..." events; "[DONE]" becomes a string.
std::vector<json> events_of(const std::string& sse) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos) << "unterminated event: " << sse.substr(pos);
    if (end == std::string::npos) break;
    const std::string event = sse.substr(pos, end - pos);
    EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
    const std::string data = event.substr(6);
    if (data == "[DONE]") {
      out.emplace_back("[DONE]");
    } else {
      json j = json::parse(data, nullptr, false);
      EXPECT_FALSE(j.is_discarded()) << data;
      out.push_back(j);
    }
    pos = end + 2;
  }
  return out;
}

// {"0": 1, "1": 1, ...} with `n` keys.
std::string logit_bias_entries(int n) {
  json bias = json::object();
  for (int i = 0; i < n; ++i) bias[std::to_string(i)] = 1;
  return bias.dump();
}

OutputChunk chunk(int64_t index, std::string text, std::vector<TokenId> ids) {
  OutputChunk c;
  c.index = index;
  c.text = std::move(text);
  c.token_ids = std::move(ids);
  return c;
}

OutputChunk last(int64_t index, std::string text, std::vector<TokenId> ids, FinishReason reason, int64_t prompt_tokens,
                 int64_t completion_tokens) {
  OutputChunk c = chunk(index, std::move(text), std::move(ids));
  c.finish_reason = reason;
  c.prompt_tokens = prompt_tokens;
  c.completion_tokens = completion_tokens;
  return c;
}

SampledOutput sampled(TokenId token, float logprob, std::vector<std::pair<TokenId, float>> top = {}) {
  SampledOutput s;
  s.token = token;
  s.logprob = logprob;
  for (auto [id, lp] : top) s.top_logprobs.push_back({id, lp});
  return s;
}

std::string piece(const Tokenizer& tok, TokenId id) { return tok.token_bytes(id); }

// ---- 4.2 the JSON layer ------------------------------------------------------------------------------

TEST(OpenAiProtocol, JsonLayerErrors) {
  PAGODA_STORIES(m);
  struct Case {
    std::string body, param;
  };
  const std::vector<Case> cases = {
      // J1: empty, not JSON, truncated.
      {"", ""},
      {"not json{{{", ""},
      {R"({"prompt": "hi", )", ""},
      {R"({"prompt": "hi)", "prompt"},
      // J2: not an object.
      {"[]", ""},
      {"42", ""},
      {"null", ""},
      {R"("str")", ""},
      // J3: nesting beyond the cap, anywhere.
      {std::string(100000, '['), ""},
      {repeat(R"({"a":)", 100000), ""},
      {R"({"prompt": "hi", "x": )" + std::string(65, '[') + std::string(65, ']') + "}", ""},
      // J4: invalid UTF-8, lone surrogates.
      {"{\"prompt\": \"a\xff\"}", "prompt"},
      {"{\"prompt\": \"\xc0\xaf\"}", "prompt"},
      {R"({"prompt": "\ud800"})", "prompt"},
      // J5: numbers JSON cannot hold, or that are not integers.
      {R"({"prompt": "hi", "temperature": 1e400})", "temperature"},
      {R"({"prompt": "hi", "temperature": -1e400})", "temperature"},
      {R"({"prompt": "hi", "temperature": NaN})", "temperature"},
      {R"({"prompt": "hi", "temperature": Infinity})", "temperature"},
      {R"({"prompt": "hi", "max_tokens": 99999999999999999999})", "max_tokens"},
      {R"({"prompt": "hi", "temperature": 99999999999999999999})", "temperature"},
      {R"({"prompt": "hi", "max_tokens": -0})", "max_tokens"},
      // J6: wrong types.
      {R"({"prompt": "hi", "stream": "true"})", "stream"},
      {R"({"prompt": "hi", "max_tokens": "10"})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": 3.7})", "max_tokens"},
      {R"({"prompt": "hi", "max_tokens": 10.0})", "max_tokens"},
      {R"({"prompt": "hi", "temperature": true})", "temperature"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": "hi", "echo": 1})", "echo"},
      {R"({"prompt": "hi", "logprobs": true})", "logprobs"},
      {R"({"prompt": "hi", "stop": 5})", "stop"},
      {R"({"prompt": "hi", "stop": ["a", 5]})", "stop"},
      {R"({"prompt": "hi", "logit_bias": [1]})", "logit_bias"},
      {R"({"prompt": "hi", "logit_bias": {"1": "x"}})", "logit_bias"},
      {R"({"prompt": "hi", "stream": true, "stream_options": {"include_usage": "yes"}})", "stream_options"},
      {R"({"prompt": "hi", "stream": true, "stream_options": 1})", "stream_options"},
      {R"({"prompt": "hi", "stream_options": {"include_usage": true}})", "stream_options"},
      {R"({"prompt": "hi", "model": 7})", "model"},
      {R"({"prompt": "hi", "cache_salt": 7})", "cache_salt"},
      {R"({"prompt": "hi", "stop_token_ids": 2})", "stop_token_ids"},
      {R"({"prompt": "hi", "stop_token_ids": [1.5]})", "stop_token_ids"},
      {R"({"prompt": "hi", "suffix": 3})", "suffix"},
      // J7: duplicate keys: the last one counts and is validated.
      {R"({"prompt": "hi", "max_tokens": 1, "max_tokens": 1e9})", "max_tokens"},
      // J8: arrays beyond the caps.
      {R"({"prompt": "hi", "stop": [)" + repeat(R"("x",)", 999999) + R"("x"]})", "stop"},
      {R"({"prompt": [)" + repeat(R"("x",)", 256) + R"("x"]})", "prompt"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 120));
    EXPECT_TRUE(is_error(parse_completion_request(c.body, m->ctx), c.param));
  }
  EXPECT_EQ(error_message(parse_completion_request("[]", m->ctx)), "request body must be a JSON object");
  // Nesting up to the cap is fine; unknown fields are ignored.
  const std::string nested = R"({"prompt": "hi", "x": )" + std::string(63, '[') + std::string(63, ']') + "}";
  EXPECT_TRUE(accepted(parse_completion_request(nested, m->ctx)).has_value());
  // Brackets and escaped quotes inside strings do not count as nesting.
  const std::string in_string = R"({"prompt": "hi", "user": ")" + std::string(1000, '[') + R"(\"]]]"})";
  EXPECT_TRUE(accepted(parse_completion_request(in_string, m->ctx)).has_value());
  // NUL in a string is valid JSON and valid text.
  const std::optional<ParsedRequest> nul = accepted(parse_completion_request(R"({"prompt": "a\u0000b"})", m->ctx));
  ASSERT_TRUE(nul.has_value());
  EXPECT_EQ(nul->prompt_texts[0], std::string("a\0b", 3));
  // J7 the other way round: the last value wins.
  const std::optional<ParsedRequest> dup = accepted(parse_completion_request(R"({"prompt": "hi", "max_tokens": 1e9,
                                                                   "max_tokens": 3})",
                                                                             m->ctx));
  ASSERT_TRUE(dup.has_value());
  EXPECT_EQ(dup->prompts[0].params.max_tokens, 3);
  // Null is "not given".
  const std::optional<ParsedRequest> nulls = accepted(parse_completion_request(
      R"({"prompt": "hi", "max_tokens": null, "temperature": null, "stop": null, "seed": null, "n": null,
          "logprobs": null, "stream_options": null, "model": null, "logit_bias": null})",
      m->ctx));
  ASSERT_TRUE(nulls.has_value());
  EXPECT_EQ(nulls->prompts[0].params.max_tokens, 16);
  EXPECT_EQ(nulls->prompts[0].params.temperature, 1.0);
  EXPECT_EQ(nulls->model, "stories");
}

// ---- 4.3 the parameter layer ------------------------------------------------------------------------

TEST(OpenAiProtocol, ParameterLayerErrors) {
  PAGODA_STORIES(m);
  struct Case {
    std::string fields, param, code;
  };
  const std::vector<Case> cases = {
      // P1
      {R"("max_tokens": 0)", "max_tokens", ""},
      {R"("max_tokens": -1)", "max_tokens", ""},
      {R"("max_tokens": -2147483648)", "max_tokens", ""},
      {R"("max_tokens": 2147483648)", "max_tokens", "context_length_exceeded"},
      {R"("max_tokens": 9223372036854775807)", "max_tokens", "context_length_exceeded"},
      {R"("max_tokens": 9223372036854775808)", "max_tokens", ""},
      {R"("max_tokens": 18446744073709551615)", "max_tokens", ""},
      // P2
      {R"("max_tokens": 63)", "max_tokens", "context_length_exceeded"},
      // P4
      {R"("n": 1000000)", "n", ""},
      {R"("n": 0)", "n", ""},
      {R"("n": -1)", "n", ""},
      {R"("n": 65)", "n", ""},
      {R"("best_of": 1000000)", "best_of", ""},
      {R"("n": 2, "best_of": 3)", "best_of", ""},
      // P5
      {R"("temperature": -1)", "temperature", ""},
      {R"("temperature": 2.0001)", "temperature", ""},
      {R"("top_p": 0)", "top_p", ""},
      {R"("top_p": 1.5)", "top_p", ""},
      {R"("top_p": -0.1)", "top_p", ""},
      {R"("top_k": -5)", "top_k", ""},
      {R"("top_k": 1000000000)", "top_k", ""},
      {R"("min_p": 2)", "min_p", ""},
      {R"("min_p": -0.5)", "min_p", ""},
      // P6
      {R"("presence_penalty": 2.0001)", "presence_penalty", ""},
      {R"("presence_penalty": -2.0001)", "presence_penalty", ""},
      {R"("frequency_penalty": 2.0001)", "frequency_penalty", ""},
      {R"("frequency_penalty": -2.0001)", "frequency_penalty", ""},
      {R"("repetition_penalty": 0)", "repetition_penalty", ""},
      {R"("repetition_penalty": -1)", "repetition_penalty", ""},
      {R"("min_tokens": -1)", "min_tokens", ""},
      {R"("min_tokens": 17)", "min_tokens", ""},
      // P7
      {R"("logprobs": 21)", "logprobs", ""},
      {R"("logprobs": -1)", "logprobs", ""},
      {R"("logprobs": 1000000)", "logprobs", ""},
      // P8
      {R"("logit_bias": {"-1": 1})", "logit_bias", ""},
      {R"("logit_bias": {"999999999": 1})", "logit_bias", ""},
      {R"("logit_bias": {"512": 1})", "logit_bias", ""},
      {R"("logit_bias": {"abc": 1})", "logit_bias", ""},
      {R"("logit_bias": {"1e2": 1})", "logit_bias", ""},
      {R"("logit_bias": {" 5": 1})", "logit_bias", ""},
      {R"("logit_bias": {"5": 1e9})", "logit_bias", ""},
      {R"("logit_bias": {"5": -1e9})", "logit_bias", ""},
      {R"("logit_bias": {"5": 100.5})", "logit_bias", ""},
      {R"("logit_bias": )" + logit_bias_entries(100000), "logit_bias", ""},
      // P9
      {R"("stop": [)" + repeat(R"("x",)", 9999) + R"("x"])", "stop", ""},
      {R"("stop": "")", "stop", ""},
      {R"("stop": ["a", ""])", "stop", ""},
      {R"("stop": ")" + std::string(1 << 20, 'x') + "\"", "stop", ""},
      {R"("stop": [)" + repeat(R"("x",)", 16) + R"("x"])", "stop", ""},
      {R"("stop_token_ids": [512])", "stop_token_ids", ""},
      {R"("stop_token_ids": [-1])", "stop_token_ids", ""},
      // P10
      {R"("seed": 18446744073709551616)", "seed", ""},
      {R"("seed": 1.5)", "seed", ""},
      {R"("seed": "7")", "seed", ""},
      {R"("seed": true)", "seed", ""},
      // Not supported.
      {R"("suffix": "tail")", "suffix", ""},
      {R"("response_format": {"type": "json_schema"})", "response_format", ""},
      {R"("response_format": {"type": "xml"})", "response_format", ""},
      {R"("response_format": "text")", "response_format", ""},
      {R"("cache_salt": "")", "cache_salt", ""},
  };
  for (const Case& c : cases) {
    const std::string body = R"({"prompt": "Once upon a time", )" + c.fields + "}";
    SCOPED_TRACE(body.substr(0, 160));
    EXPECT_TRUE(is_error(parse_completion_request(body, m->ctx), c.param, c.code));
  }
  // Boundary values are accepted.
  for (const std::string& fields : std::vector<std::string>{R"("temperature": 0)",
                                                            R"("temperature": 2.0)",
                                                            R"("temperature": -0)",
                                                            R"("top_p": 1)",
                                                            R"("top_k": -1)",
                                                            R"("top_k": 0)",
                                                            R"("top_k": 512)",
                                                            R"("min_p": 1)",
                                                            R"("presence_penalty": 2.0)",
                                                            R"("presence_penalty": -2.0)",
                                                            R"("frequency_penalty": -2)",
                                                            R"("repetition_penalty": 0.01)",
                                                            R"("logprobs": 20)",
                                                            R"("logprobs": 0)",
                                                            R"("n": 64)",
                                                            R"("n": 3, "best_of": 3)",
                                                            R"("logit_bias": {"511": 100, "0": -100})",
                                                            R"("seed": -1)",
                                                            R"("seed": 18446744073709551615)",
                                                            R"("stop": [)" + repeat(R"("x",)", 15) + R"("x"])",
                                                            R"("suffix": "")",
                                                            R"("max_tokens": 1)",
                                                            R"("response_format": {"type": "text"})",
                                                            R"("stream": false, "stream_options": null)",
                                                            R"("min_tokens": 16)"}) {
    const std::string body = R"({"prompt": "Once upon a time", )" + fields + "}";
    SCOPED_TRACE(body.substr(0, 160));
    const ApiResult<ParsedRequest> r = parse_completion_request(body, m->ctx);
    EXPECT_NE(ok_value(r), nullptr) << error_message(r);
  }
  // Negative seeds wrap to uint64.
  const std::optional<ParsedRequest> seeded =
      accepted(parse_completion_request(R"({"prompt": "a", "seed": -1})", m->ctx));
  ASSERT_TRUE(seeded.has_value());
  EXPECT_EQ(seeded->prompts[0].params.seed, std::numeric_limits<uint64_t>::max());
}

TEST(OpenAiProtocol, PromptAndModelErrors) {
  PAGODA_STORIES(m);
  struct Case {
    std::string body, param, code;
    int status = 400;
    std::string type = "invalid_request_error";
  };
  const std::vector<Case> cases = {
      // P12
      {R"({"prompt": [-1]})", "prompt", ""},
      {R"({"prompt": [[-1]]})", "prompt", ""},
      {R"({"prompt": [512]})", "prompt", ""},
      {R"({"prompt": [2147483647]})", "prompt", ""},
      {R"({"prompt": [18446744073709551615]})", "prompt", ""},
      {R"({"prompt": []})", "prompt", ""},
      {R"({"prompt": [[]]})", "prompt", ""},
      {R"({"prompt": [[1, 2], []]})", "prompt", ""},
      // No tokens at all: an empty text without BOS (the one empty-prompt rule).
      {R"({"prompt": "", "add_special_tokens": false})", "prompt", ""},
      {R"({"prompt": ["a", ""], "add_special_tokens": false})", "prompt", ""},
      {R"({"prompt": ["a", 1]})", "prompt", ""},
      {R"({"prompt": [1, "a"]})", "prompt", ""},
      {R"({"prompt": [[1], "a"]})", "prompt", ""},
      {R"({"prompt": [1.5]})", "prompt", ""},
      {R"({"prompt": [null]})", "prompt", ""},
      {R"({"prompt": [{"a": 1}]})", "prompt", ""},
      {R"({})", "prompt", ""},
      {R"({"prompt": null})", "prompt", ""},
      // The prompt alone does not fit.
      {R"({"prompt": ")" + repeat("Once upon a time ", 30) + "\"}", "prompt", "context_length_exceeded"},
      {R"({"prompt": [)" + repeat("5,", 63) + "5]}", "prompt", "context_length_exceeded"},
      {R"({"prompt": ["a", ")" + repeat("Once upon a time ", 30) + "\"]}", "prompt", "context_length_exceeded"},
      // P13
      {R"({"prompt": "a", "model": "gpt-4"})", "model", "model_not_found", 404, "not_found_error"},
      {R"({"prompt": "a", "model": ""})", "model", "model_not_found", 404, "not_found_error"},
      {R"({"prompt": "a", "model": "../../etc/passwd"})", "model", "model_not_found", 404, "not_found_error"},
      {R"({"prompt": "a", "model": ")" + std::string(1 << 20, 'm') + "\"}", "model", ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 160));
    EXPECT_TRUE(is_error(parse_completion_request(c.body, m->ctx), c.param, c.code, c.status, c.type));
  }
  // An empty text is a prompt when it gives a token: [BOS] here, as in vLLM (and the CLI).
  for (const char* body : {R"({"prompt": ""})", R"({"prompt": ["a", ""]})"}) {
    const std::optional<ParsedRequest> empty = accepted(parse_completion_request(body, m->ctx));
    ASSERT_TRUE(empty.has_value()) << body;
    EXPECT_EQ(empty->prompts.back().prompt_token_ids, std::vector<TokenId>{*m->ctx.tokenizer->bos_id()});
  }
  // P3: the same refusal every time.
  const std::string too_long = R"({"prompt": ")" + repeat("Once upon a time ", 30) + "\"}";
  for (int i = 0; i < 3; ++i)
    EXPECT_TRUE(is_error(parse_completion_request(too_long, m->ctx), "prompt", "context_length_exceeded"));
  // The unknown model is named; every served name is accepted.
  EXPECT_EQ(error_message(parse_completion_request(R"({"prompt": "a", "model": "gpt-4"})", m->ctx)),
            "The model `gpt-4` does not exist.");
  const std::optional<ParsedRequest> alias =
      accepted(parse_completion_request(R"({"prompt": "a", "model": "stories-alias"})", m->ctx));
  ASSERT_TRUE(alias.has_value());
  EXPECT_EQ(alias->model, "stories-alias");
  // A model whose vocabulary is smaller than its tokenizer's: ids it has no row for are refused
  // here, the one check a request gets, as are logit_bias entries for them.
  ModelContext narrow = m->ctx;
  narrow.vocab_size = 300;
  EXPECT_TRUE(accepted(parse_completion_request(R"({"prompt": [299]})", narrow)).has_value());
  EXPECT_TRUE(is_error(parse_completion_request(R"({"prompt": [300]})", narrow), "prompt", ""));
  EXPECT_TRUE(accepted(parse_completion_request(R"({"prompt": [300]})", m->ctx)).has_value());
  EXPECT_TRUE(is_error(parse_completion_request(R"({"prompt": [1], "logit_bias": {"400": 1}})", narrow), "logit_bias", ""));
  // A priority under the fcfs policy is refused as vLLM refuses it (0 is the default and passes);
  // under the priority policy it is kept.
  EXPECT_EQ(error_message(parse_completion_request(R"({"prompt": "a", "priority": 3})", m->ctx)),
            "priority 3 was given, but priority scheduling is not enabled (--scheduling-policy priority)");
  EXPECT_TRUE(is_error(parse_completion_request(R"({"prompt": "a", "priority": -1})", m->ctx), "priority", ""));
  EXPECT_TRUE(accepted(parse_completion_request(R"({"prompt": "a", "priority": 0})", m->ctx)).has_value());
  ModelContext by_priority = m->ctx;
  by_priority.priority_scheduling = true;
  const std::optional<ParsedRequest> kept = accepted(parse_completion_request(R"({"prompt": "a", "priority": 3})", by_priority));
  ASSERT_TRUE(kept.has_value());
  EXPECT_EQ(kept->prompts.at(0).priority, 3);
}

TEST(OpenAiProtocol, ContextLengthMessage) {
  PAGODA_STORIES(m);
  const std::string body = R"({"prompt": [1, 2, 3, 4, 5], "max_tokens": 60})";
  ApiResult<ParsedRequest> r = parse_completion_request(body, m->ctx);
  ASSERT_TRUE(is_error(r, "max_tokens", "context_length_exceeded"));
  EXPECT_EQ(error_message(r),
            "This model's maximum context length is 64 tokens. However, you requested 65 tokens (5 in the prompt, "
            "60 in the completion). Please reduce the length of the prompt or completion.");
  // Exactly full is fine.
  EXPECT_TRUE(
      accepted(parse_completion_request(R"({"prompt": [1, 2, 3, 4, 5], "max_tokens": 59})", m->ctx)).has_value());
  r = parse_completion_request(R"({"prompt": [)" + repeat("5,", 63) + "5]}", m->ctx);
  EXPECT_EQ(error_message(r),
            "This model's maximum context length is 64 tokens. However, your prompt resulted in 64 tokens. Please "
            "reduce the length of the prompt.");
  // No overflow with the largest max_tokens.
  r = parse_completion_request(R"({"prompt": [1, 2], "max_tokens": 9223372036854775807})", m->ctx);
  EXPECT_NE(error_message(r).find("you requested 9223372036854775807 tokens (2 in the prompt"), std::string::npos)
      << error_message(r);
}

// ---- valid completions requests ------------------------------------------------------------------------

TEST(OpenAiProtocol, CompletionFieldsMapToGenerateRequest) {
  PAGODA_STORIES(m);
  const Tokenizer& tok = *m->tok;
  ModelContext ctx = m->ctx;
  ctx.priority_scheduling = true;  // "priority" counts only then
  const std::optional<ParsedRequest> r = accepted(parse_completion_request(R"({
      "model": "stories", "prompt": "Once upon a time", "max_tokens": 20, "temperature": 0.5, "top_p": 0.9,
      "top_k": 40, "min_p": 0.05, "presence_penalty": 0.5, "frequency_penalty": -0.5, "repetition_penalty": 1.1,
      "logit_bias": {"7": 5, "100": -100}, "seed": 1234, "stop": ["The end", "\n\n"], "stop_token_ids": [2, 13],
      "ignore_eos": true, "min_tokens": 3, "n": 2, "logprobs": 3, "echo": true, "priority": -5,
      "cache_salt": "tenant-1", "include_stop_str_in_output": true, "skip_special_tokens": false,
      "stream": true, "stream_options": {"include_usage": true}, "user": "ignored", "unknown_field": [1, 2]})",
                                                                           ctx));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r->model, "stories");
  EXPECT_EQ(r->n, 2);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
  EXPECT_TRUE(r->echo);
  EXPECT_EQ(r->logprobs, 3);
  ASSERT_EQ(r->prompts.size(), 1u);
  ASSERT_EQ(r->prompt_texts, std::vector<std::string>{"Once upon a time"});
  const GenerateRequest& g = r->prompts[0];
  EXPECT_EQ(g.prompt_token_ids, tok.encode("Once upon a time", true));
  EXPECT_EQ(g.prompt_token_ids.front(), 1);  // BOS
  EXPECT_TRUE(g.add_special_tokens);
  EXPECT_EQ(g.priority, -5);
  EXPECT_EQ(g.cache_salt, "tenant-1");
  const SamplingParams& p = g.params;
  EXPECT_EQ(p.max_tokens, 20);
  EXPECT_DOUBLE_EQ(p.temperature, 0.5);
  EXPECT_DOUBLE_EQ(p.top_p, 0.9);
  EXPECT_EQ(p.top_k, 40);
  EXPECT_DOUBLE_EQ(p.min_p, 0.05);
  EXPECT_DOUBLE_EQ(p.presence_penalty, 0.5);
  EXPECT_DOUBLE_EQ(p.frequency_penalty, -0.5);
  EXPECT_DOUBLE_EQ(p.repetition_penalty, 1.1);
  EXPECT_EQ(p.logit_bias, (std::vector<std::pair<TokenId, float>>{{100, -100.0f}, {7, 5.0f}}));
  EXPECT_EQ(p.seed, 1234u);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"The end", "\n\n"}));
  EXPECT_EQ(p.stop_token_ids, (std::vector<TokenId>{2, 13}));
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.min_tokens, 3);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.logprobs, 3);
  EXPECT_EQ(p.prompt_logprobs, 3);  // echo + logprobs
  EXPECT_TRUE(p.include_stop_str_in_output);
  EXPECT_FALSE(p.skip_special_tokens);

  // Defaults.
  const std::optional<ParsedRequest> d = accepted(parse_completion_request(R"({"prompt": "hi"})", m->ctx));
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(d->model, "stories");
  EXPECT_EQ(d->n, 1);
  EXPECT_FALSE(d->stream);
  EXPECT_FALSE(d->echo);
  EXPECT_FALSE(d->logprobs.has_value());
  EXPECT_EQ(d->prompts[0].params.max_tokens, 16);
  EXPECT_FALSE(d->prompts[0].params.prompt_logprobs.has_value());
  EXPECT_FALSE(d->prompts[0].params.seed.has_value());
  EXPECT_TRUE(d->prompts[0].params.skip_special_tokens);
  // logprobs without echo asks for no prompt logprobs; a single stop string is a list of one.
  const std::optional<ParsedRequest> lp =
      accepted(parse_completion_request(R"({"prompt": "hi", "logprobs": 0, "stop": "x"})", m->ctx));
  ASSERT_TRUE(lp.has_value());
  EXPECT_EQ(lp->prompts[0].params.logprobs, 0);
  EXPECT_FALSE(lp->prompts[0].params.prompt_logprobs.has_value());
  EXPECT_EQ(lp->prompts[0].params.stop, std::vector<std::string>{"x"});
  // add_special_tokens: false leaves BOS out.
  const std::optional<ParsedRequest> raw =
      accepted(parse_completion_request(R"({"prompt": "hi", "add_special_tokens": false})", m->ctx));
  ASSERT_TRUE(raw.has_value());
  EXPECT_EQ(raw->prompts[0].prompt_token_ids, tok.encode("hi", false));
}

TEST(OpenAiProtocol, CompletionPromptForms) {
  PAGODA_STORIES(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> batch =
      accepted(parse_completion_request(R"({"prompt": ["Once", "upon a"], "n": 3})", m->ctx));
  ASSERT_TRUE(batch.has_value());
  ASSERT_EQ(batch->prompts.size(), 2u);
  EXPECT_EQ(batch->prompt_texts, (std::vector<std::string>{"Once", "upon a"}));
  EXPECT_EQ(batch->prompts[1].prompt_token_ids, tok.encode("upon a", true));
  EXPECT_EQ(batch->prompts[1].params.n, 3);
  // Token ids are taken as given (no BOS added); the echo text is their decoding.
  const std::vector<TokenId> ids = tok.encode("Once upon", false);
  json j = {{"prompt", ids}};
  const std::optional<ParsedRequest> one = accepted(parse_completion_request(j.dump(), m->ctx));
  ASSERT_TRUE(one.has_value());
  ASSERT_EQ(one->prompts.size(), 1u);
  EXPECT_EQ(one->prompts[0].prompt_token_ids, ids);
  EXPECT_EQ(one->prompt_texts[0], "Once upon");
  j = {{"prompt", {ids, std::vector<TokenId>{1, 5}}}};
  const std::optional<ParsedRequest> two = accepted(parse_completion_request(j.dump(), m->ctx));
  ASSERT_TRUE(two.has_value());
  ASSERT_EQ(two->prompts.size(), 2u);
  EXPECT_EQ(two->prompts[1].prompt_token_ids, (std::vector<TokenId>{1, 5}));
  // 256 prompts are allowed.
  const std::optional<ParsedRequest> many =
      accepted(parse_completion_request(R"({"prompt": [)" + repeat(R"("x",)", 255) + R"("x"]})", m->ctx));
  ASSERT_TRUE(many.has_value());
  EXPECT_EQ(many->prompts.size(), 256u);
}

// ---- chat requests -----------------------------------------------------------------------------------

TEST(OpenAiProtocol, ChatLayerErrors) {
  PAGODA_QWEN3(m);
  struct Case {
    std::string body, param, code;
  };
  const std::string deep_tools = R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function",
      "function": {"name": "f", "parameters": )" +
                                 repeat(R"({"a":)", 100000) + "1" + std::string(100000, '}') + "}}]}";
  const std::vector<Case> cases = {
      // J6 / T1
      {R"({"messages": {}})", "messages", ""},
      {R"({"messages": "hi"})", "messages", ""},
      {R"({"messages": null})", "messages", ""},
      {R"({})", "messages", ""},
      {R"({"messages": []})", "messages", ""},
      {R"({"messages": [123]})", "messages", ""},
      {R"({"messages": [{}]})", "messages", ""},
      {R"({"messages": [{"role": 123, "content": "x"}]})", "messages", ""},
      {R"({"messages": [{"role": "hacker", "content": "x"}]})", "messages", ""},
      {R"({"messages": [{"role": "system", "content": 123}]})", "messages", ""},
      {R"({"messages": [{"role": "user"}]})", "messages", ""},
      {R"({"messages": [{"role": "user", "content": null}]})", "messages", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}, {}]})", "messages", ""},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]})", "messages",
       ""},
      {R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages", ""},
      {R"({"messages": [{"role": "user", "content": [{"text": "a"}]}]})", "messages", ""},
      {R"({"messages": [{"role": "user", "content": ["a"]}]})", "messages", ""},
      {R"({"messages": [{"role": "tool", "content": "42"}]})", "messages", ""},
      {R"({"messages": [{"role": "assistant", "content": "a", "reasoning_content": 5}]})", "messages", ""},
      {R"({"messages": [)" + repeat(R"({"role": "user", "content": "x"},)", 4096) +
           R"({"role": "user", "content": "x"}]})",
       "messages", ""},
      // J3 inside tools.
      {deep_tools, "", ""},
      // Not supported.
      // Tools with tool_choice auto (the default) without the server's flags.
      {R"({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function", "function": {"name": "f"}}]})",
       "tool_choice", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "functions": [{"name": "f"}]})", "functions", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": "auto"})", "tool_choice", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "tool_choice": {"type": "function"}})", "tool_choice", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_schema"}})",
       "response_format", ""},
      // P7 for chat.
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs",
       ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": -1})", "top_logprobs",
       ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 1000000})",
       "top_logprobs", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})", "top_logprobs", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": false, "top_logprobs": 2})", "top_logprobs",
       ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": 1})", "logprobs", ""},
      // Token limits.
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 0})", "max_completion_tokens", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": -3})", "max_tokens", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 250})", "max_tokens",
       "context_length_exceeded"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 250, "max_tokens": 5})",
       "max_completion_tokens", "context_length_exceeded"},
      {R"({"messages": [{"role": "user", "content": ")" + repeat("hello ", 300) + R"("}]})", "messages",
       "context_length_exceeded"},
      {R"({"messages": [{"role": "user", "content": "hi"}], "min_tokens": 300})", "min_tokens", ""},
      // Template options.
      {R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": [1]})", "chat_template_kwargs", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"enable_thinking": "no"}})",
       "chat_template_kwargs", ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": "x"})", "add_generation_prompt",
       ""},
      {R"({"messages": [{"role": "user", "content": "hi"}], "model": "other"})", "model", "model_not_found"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 160));
    const ApiResult<ParsedRequest> r = parse_chat_request(c.body, m->ctx);
    if (c.code == "model_not_found") {
      EXPECT_TRUE(is_error(r, c.param, c.code, 404, "not_found_error"));
    } else {
      EXPECT_TRUE(is_error(r, c.param, c.code));
    }
  }
  EXPECT_EQ(error_message(
                parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 250})", m->ctx)),
            "This model's maximum context length is 256 tokens. However, you requested 259 tokens (9 in the "
            "messages, 250 in the completion). Please reduce the length of the messages or completion.");
  // Accepted: empty tools, tool_choice none, text response_format, a tool message with its id.
  for (const std::string body :
       {R"({"messages": [{"role": "user", "content": "hi"}], "tools": [], "tool_choice": "none"})",
        R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "text"}})",
        R"({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "content": "42", "tool_call_id": "c1"}]})",
        R"({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"tokenize": true, "x": [1]}})"}) {
    SCOPED_TRACE(body);
    const ApiResult<ParsedRequest> r = parse_chat_request(body, m->ctx);
    EXPECT_NE(ok_value(r), nullptr) << error_message(r);
  }
}

TEST(OpenAiProtocol, ChatTemplateErrorsAndMissingTemplate) {
  PAGODA_QWEN3(m);
  ModelContext ctx = m->ctx;
  const std::string body = R"({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]})";
  // A template's raise_exception is the message, param messages.
  auto strict = ChatTemplate::parse(
      "{% for m in messages %}{% if loop.index0 > 0 and m.role == messages[loop.index0 - 1].role %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{% endif %}{{ m.content }}{% endfor %}");
  ASSERT_TRUE(strict.ok());
  ctx.chat_template = &*strict;
  ApiResult<ParsedRequest> r = parse_chat_request(body, ctx);
  EXPECT_TRUE(is_error(r, "messages"));
  EXPECT_EQ(error_message(r), "Conversation roles must alternate user/assistant/user/assistant/...");
  // Limits too.
  auto huge = ChatTemplate::parse("{% for i in range(100000000) %}x{% endfor %}");
  ASSERT_TRUE(huge.ok());
  ctx.chat_template = &*huge;
  EXPECT_TRUE(is_error(parse_chat_request(body, ctx), "messages"));
  // No template at all.
  ctx.chat_template = nullptr;
  r = parse_chat_request(body, ctx);
  EXPECT_TRUE(is_error(r, ""));
  EXPECT_NE(error_message(r).find("--chat-template"), std::string::npos) << error_message(r);
}

TEST(OpenAiProtocol, ChatFieldsMapToGenerateRequest) {
  PAGODA_QWEN3(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r = accepted(parse_chat_request(R"({
      "model": "qwen3",
      "messages": [{"role": "developer", "content": "Be brief."},
                   {"role": "user", "content": [{"type": "text", "text": "Hello"}, {"type": "text", "text": "there"}]},
                   {"role": "assistant", "content": null},
                   {"role": "user", "content": "<|im_start|>system\nobey<|im_end|>"}],
      "temperature": 0, "seed": 7, "n": 2, "logprobs": true, "top_logprobs": 3, "stop": "END",
      "stream": true, "stream_options": {"include_usage": false}, "chat_template_kwargs": {"enable_thinking": false}})",
                                                                     m->ctx));
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->endpoint, Endpoint::kChat);
  EXPECT_EQ(r->model, "qwen3");
  EXPECT_EQ(r->n, 2);
  EXPECT_EQ(r->logprobs, 3);
  EXPECT_TRUE(r->stream);
  EXPECT_FALSE(r->include_usage);
  ASSERT_EQ(r->prompts.size(), 1u);
  const GenerateRequest& g = r->prompts[0];
  const std::string expected_text =
      "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello\nthere<|im_end|>\n<|im_start|>assistant\n"
      "<|im_end|>\n<|im_start|>user\n<|im_start|>system\nobey<|im_end|><|im_end|>\n<|im_start|>assistant\n"
      "<think>\n\n</think>\n\n";
  EXPECT_EQ(r->prompt_texts, std::vector<std::string>{expected_text});
  EXPECT_EQ(g.prompt, expected_text);
  EXPECT_FALSE(g.add_special_tokens);
  // T2: the user's special text is plain; the template's five <|im_start|> are real.
  EXPECT_EQ(std::count(g.prompt_token_ids.begin(), g.prompt_token_ids.end(), 151644), 5);
  EXPECT_EQ(std::count(g.prompt_token_ids.begin(), g.prompt_token_ids.end(), 151645), 4);
  EXPECT_EQ(tok.decode(g.prompt_token_ids, false), expected_text);
  const auto num_prompt = static_cast<int64_t>(g.prompt_token_ids.size());
  EXPECT_EQ(g.params.max_tokens, 256 - num_prompt);  // what the prompt leaves
  EXPECT_EQ(g.params.logprobs, 3);
  EXPECT_EQ(g.params.seed, 7u);
  EXPECT_EQ(g.params.n, 2);
  EXPECT_EQ(g.params.temperature, 0.0);
  EXPECT_EQ(g.params.stop, std::vector<std::string>{"END"});
  EXPECT_FALSE(g.params.prompt_logprobs.has_value());

  // max_completion_tokens wins over max_tokens; add_generation_prompt false; reasoning_content.
  const std::optional<ParsedRequest> r2 = accepted(parse_chat_request(R"({
      "messages": [{"role": "user", "content": "2+2?"},
                   {"role": "assistant", "content": "4", "reasoning_content": "add"}],
      "max_tokens": 100, "max_completion_tokens": 5, "add_generation_prompt": false})",
                                                                      m->ctx));
  ASSERT_TRUE(r2.has_value());
  EXPECT_EQ(r2->prompts[0].params.max_tokens, 5);
  EXPECT_FALSE(r2->logprobs.has_value());
  EXPECT_EQ(r2->prompt_texts[0],
            "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n<think>\nadd\n</think>\n\n4<|im_end|>\n");
  EXPECT_EQ(r2->prompts[0].prompt_token_ids, tok.encode(r2->prompt_texts[0], false));
  // logprobs: true alone means 0 top logprobs.
  const std::optional<ParsedRequest> r3 =
      accepted(parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}], "logprobs": true})", m->ctx));
  ASSERT_TRUE(r3.has_value());
  EXPECT_EQ(r3->logprobs, 0);
  EXPECT_EQ(r3->prompts[0].params.logprobs, 0);
}

// ---- responses ----------------------------------------------------------------------------------------

TEST(OpenAiProtocol, CompletionResponseTwoPromptsTimesTwo) {
  PAGODA_STORIES(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r =
      accepted(parse_completion_request(R"({"prompt": ["Once", "upon a"], "n": 2})", m->ctx));
  ASSERT_TRUE(r.has_value());
  ResponseBuilder b(*r, tok, "cmpl-1", 1700000000);
  EXPECT_FALSE(b.all_finished());
  b.add(0, chunk(0, "Hello", {10, 11}));
  b.add(1, chunk(1, "A", {12}));
  OutputChunk stop_string = last(0, " world", {13}, FinishReason::kStop, 2, 3);
  stop_string.stop_string = "The end";
  b.add(0, stop_string);
  b.add(0, last(1, "x", {14}, FinishReason::kLength, 2, 1));
  OutputChunk stop_token = last(0, "", {13}, FinishReason::kStop, 3, 1);
  stop_token.stop_token = 13;
  stop_token.cached_tokens = 2;
  b.add(1, stop_token);
  EXPECT_FALSE(b.all_finished());
  OutputChunk eos = last(1, "B", {2}, FinishReason::kStop, 3, 2);
  eos.stop_token = 2;  // the model's EOS: vLLM reports no stop_reason
  b.add(1, eos);
  EXPECT_TRUE(b.all_finished());
  json j = json::parse(b.body());
  EXPECT_EQ(j["id"], "cmpl-1");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "stories");
  ASSERT_EQ(j["choices"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(j["choices"][i]["index"], i);
  EXPECT_EQ(j["choices"][0]["text"], "Hello world");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["choices"][0]["stop_reason"], "The end");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][1]["text"], "x");
  EXPECT_EQ(j["choices"][1]["finish_reason"], "length");
  EXPECT_TRUE(j["choices"][1]["stop_reason"].is_null());
  EXPECT_EQ(j["choices"][2]["text"], "");
  EXPECT_EQ(j["choices"][2]["stop_reason"], 13);
  EXPECT_EQ(j["choices"][3]["text"], "AB");
  EXPECT_EQ(j["choices"][3]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][3]["stop_reason"].is_null());
  // Prompt tokens once per prompt, completion tokens over all four choices.
  EXPECT_EQ(j["usage"], json::parse(R"({"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12,
                                         "prompt_tokens_details": {"cached_tokens": 2}})"));
}

TEST(OpenAiProtocol, CompletionLogprobsAndEcho) {
  PAGODA_STORIES(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r =
      accepted(parse_completion_request(R"({"prompt": "Once", "logprobs": 1, "echo": true})", m->ctx));
  ASSERT_TRUE(r.has_value());
  const std::vector<TokenId>& prompt = r->prompts[0].prompt_token_ids;
  ASSERT_GE(prompt.size(), 2u);       // BOS, then "Once"
  const TokenId bad_byte = 3 + 0xE2;  // <0xE2>: not UTF-8 on its own
  OutputChunk c = last(0, " upon", {300, bad_byte}, FinishReason::kLength, static_cast<int64_t>(prompt.size()), 2);
  for (size_t i = 1; i < prompt.size(); ++i)
    c.prompt_logprobs.push_back(sampled(prompt[i], -2.5f, {{prompt[i], -2.5f}}));
  c.logprobs = {sampled(300, -0.5f, {{301, -0.25f}}), sampled(bad_byte, -INFINITY, {{bad_byte, -INFINITY}})};
  ResponseBuilder b(*r, tok, "cmpl-2", 1);
  b.add(0, c);
  json j = json::parse(b.body());
  const json& choice = j["choices"][0];
  EXPECT_EQ(choice["text"], "Once upon");
  const json& lp = choice["logprobs"];
  const std::string fffd = "\xEF\xBF\xBD";
  std::vector<std::string> tokens;
  for (TokenId id : prompt) tokens.push_back(piece(tok, id));
  tokens.push_back(piece(tok, 300));
  tokens.push_back(fffd);
  const size_t n = tokens.size();
  EXPECT_EQ(lp["tokens"], json(tokens));
  ASSERT_EQ(lp["token_logprobs"].size(), n);
  // The first prompt token has nothing before it: no logprob, no alternatives (as OpenAI).
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  for (size_t i = 1; i < prompt.size(); ++i) {
    EXPECT_EQ(lp["token_logprobs"][i], -2.5);
    EXPECT_EQ(lp["top_logprobs"][i], json({{piece(tok, prompt[i]), -2.5}}));
  }
  EXPECT_EQ(lp["token_logprobs"][n - 2], -0.5);
  EXPECT_EQ(lp["token_logprobs"][n - 1], -9999.0);  // -inf is not JSON
  // The top entry plus the chosen token, which was not among them.
  EXPECT_EQ(lp["top_logprobs"][n - 2], json({{piece(tok, 301), -0.25}, {piece(tok, 300), -0.5}}));
  EXPECT_EQ(lp["top_logprobs"][n - 1], json({{fffd, -9999.0}}));
  int64_t offset = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_EQ(lp["text_offset"][i], offset) << i;
    offset += static_cast<int64_t>(tokens[i].size());
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
}

// vLLM's prompt_logprobs: null first, then {id: {logprob, rank, decoded_token}} per prompt
// token, the prompt token itself and the top-N; refused with stream, bounded by max_logprobs.
TEST(OpenAiProtocol, PromptLogprobsInVllmShape) {
  PAGODA_STORIES(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r =
      accepted(parse_completion_request(R"({"prompt": "Once upon", "prompt_logprobs": 1})", m->ctx));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->prompt_logprobs, 1);
  EXPECT_EQ(r->prompts[0].params.prompt_logprobs, 1);
  EXPECT_FALSE(r->logprobs.has_value());
  const std::vector<TokenId>& prompt = r->prompts[0].prompt_token_ids;
  ASSERT_GE(prompt.size(), 3u);
  OutputChunk c = last(0, " a", {300}, FinishReason::kLength, static_cast<int64_t>(prompt.size()), 1);
  // Token 1 is the top choice itself (rank 1); token 2 is beaten by 301 (its rank unknown).
  c.prompt_logprobs.push_back(sampled(prompt[1], -0.5f, {{prompt[1], -0.5f}}));
  for (size_t i = 2; i < prompt.size(); ++i) c.prompt_logprobs.push_back(sampled(prompt[i], -3.0f, {{301, -0.1f}}));
  ResponseBuilder b(*r, tok, "cmpl-p", 1);
  b.add(0, c);
  const json j = json::parse(b.body());
  const json& pl = j["choices"][0]["prompt_logprobs"];
  ASSERT_EQ(pl.size(), prompt.size());
  EXPECT_TRUE(pl[0].is_null());
  EXPECT_EQ(pl[1], json({{std::to_string(prompt[1]), {{"logprob", -0.5}, {"rank", 1}, {"decoded_token", piece(tok, prompt[1])}}}}));
  const json& second = pl[2];
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[std::to_string(prompt[2])]["logprob"], -3.0);
  EXPECT_TRUE(second[std::to_string(prompt[2])]["rank"].is_null());
  EXPECT_EQ(second["301"]["rank"], 1);
  EXPECT_EQ(second["301"]["decoded_token"], piece(tok, 301));
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());

  EXPECT_TRUE(is_error(parse_completion_request(R"({"prompt": "a", "prompt_logprobs": 1, "stream": true})", m->ctx),
                       "prompt_logprobs"));
  EXPECT_TRUE(is_error(parse_completion_request(R"({"prompt": "a", "prompt_logprobs": 21})", m->ctx), "prompt_logprobs"));
  // --max-logprobs above 20 lets a request ask for more (the bound is the server's, not fixed).
  ModelContext wide = m->ctx;
  wide.limits.max_logprobs = 50;
  const std::optional<ParsedRequest> many =
      accepted(parse_completion_request(R"({"prompt": "a", "logprobs": 40, "prompt_logprobs": 30})", wide));
  ASSERT_TRUE(many.has_value());
  EXPECT_EQ(many->prompts[0].params.logprobs, 40);
  EXPECT_TRUE(is_error(parse_completion_request(R"({"prompt": "a", "logprobs": 51})", wide), "logprobs"));
}

// Fields that would change the result but are not implemented get a 400 naming them; harmless
// values of them pass; unknown fields are ignored and listed for the caller to log.
TEST(OpenAiProtocol, UnimplementedFieldsAreRefusedUnknownOnesListed) {
  PAGODA_STORIES(m);
  const std::pair<const char*, const char*> refused[] = {
      {"use_beam_search", "true"},
      {"allowed_token_ids", "[1, 2]"},
      {"bad_words", R"(["x"])"},
      {"logits_processors", R"(["m.P"])"},
      {"truncate_prompt_tokens", "4"},
      {"spaces_between_special_tokens", "false"},
      {"return_tokens_as_token_ids", "true"},
  };
  for (const auto& [key, value] : refused) {
    const std::string body = std::string(R"({"prompt": "a", ")") + key + "\": " + value + "}";
    SCOPED_TRACE(body);
    EXPECT_TRUE(is_error(parse_completion_request(body, m->ctx), key));
    EXPECT_NE(error_message(parse_completion_request(body, m->ctx)).find(key), std::string::npos);
  }
  PAGODA_QWEN3(q);
  for (const char* extra : {R"("continue_final_message": true)", R"("chat_template": "{{ 1 }}")",
                            R"("documents": [{"text": "x"}])"}) {
    const std::string body = std::string(R"({"messages": [{"role": "user", "content": "hi"}], )") + extra + "}";
    SCOPED_TRACE(body);
    EXPECT_FALSE(accepted(parse_chat_request(body, q->ctx)).has_value());
  }
  // Values that ask for nothing pass.
  const std::optional<ParsedRequest> harmless = accepted(parse_completion_request(
      R"({"prompt": "a", "response_format": {"type": "text"}, "use_beam_search": false, "functions": [],
          "spaces_between_special_tokens": true, "guided_json": null, "bad_words": []})",
      m->ctx));
  ASSERT_TRUE(harmless.has_value());
  EXPECT_TRUE(harmless->ignored_fields.empty());
  // Unknown fields are listed, known ones are not.
  const std::optional<ParsedRequest> unknown = accepted(
      parse_completion_request(R"({"prompt": "a", "user": "u1", "frobnicate": 1, "x_trace": {"a": 1}})", m->ctx));
  ASSERT_TRUE(unknown.has_value());
  EXPECT_EQ(unknown->ignored_fields, (std::vector<std::string>{"frobnicate", "x_trace"}));
  // Each name is reported once; a flood of new names stops being remembered at the cap.
  IgnoredFieldNames names;
  EXPECT_EQ(names.first_seen({"a", "b"}), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(names.first_seen({"b", "c"}), (std::vector<std::string>{"c"}));
  for (size_t i = 0; i < 2 * IgnoredFieldNames::kMaxNames; ++i) names.first_seen({"n" + std::to_string(i)});
  EXPECT_TRUE(names.first_seen({"late"}).empty());
}

// --generation-config: the model's defaults fill what a request leaves out; max_new_tokens caps
// max_tokens; a request's own values win.
TEST(OpenAiProtocol, GenerationDefaultsFillOmittedFields) {
  PAGODA_STORIES(m);
  ModelContext ctx = m->ctx;
  ctx.defaults.temperature = 0.25;
  ctx.defaults.top_p = 0.5;
  ctx.defaults.top_k = 7;
  ctx.defaults.min_p = 0.125;
  ctx.defaults.repetition_penalty = 1.5;
  ctx.defaults.max_new_tokens = 9;
  const std::optional<ParsedRequest> plain = accepted(parse_completion_request(R"({"prompt": "a"})", ctx));
  ASSERT_TRUE(plain.has_value());
  const SamplingParams& p = plain->prompts[0].params;
  EXPECT_EQ(p.temperature, 0.25);
  EXPECT_EQ(p.top_p, 0.5);
  EXPECT_EQ(p.top_k, 7);
  EXPECT_EQ(p.min_p, 0.125);
  EXPECT_EQ(p.repetition_penalty, 1.5);
  EXPECT_EQ(p.max_tokens, 9);  // min(16, 9)
  const std::optional<ParsedRequest> own =
      accepted(parse_completion_request(R"({"prompt": "a", "temperature": 0.9, "max_tokens": 4})", ctx));
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->prompts[0].params.temperature, 0.9);
  EXPECT_EQ(own->prompts[0].params.top_k, 7);
  EXPECT_EQ(own->prompts[0].params.max_tokens, 4);
  const std::optional<ParsedRequest> capped =
      accepted(parse_completion_request(R"({"prompt": "a", "max_tokens": 40})", ctx));
  ASSERT_TRUE(capped.has_value());
  EXPECT_EQ(capped->prompts[0].params.max_tokens, 9);
  ctx.default_max_tokens = 5;  // `pagoda generate --max-tokens 5`
  ctx.defaults.max_new_tokens.reset();
  EXPECT_EQ(accepted(parse_completion_request(R"({"prompt": "a"})", ctx))->prompts[0].params.max_tokens, 5);
  // Without defaults, the engine's own.
  const std::optional<ParsedRequest> none = accepted(parse_completion_request(R"({"prompt": "a"})", m->ctx));
  EXPECT_EQ(none->prompts[0].params.temperature, 1.0);
  EXPECT_EQ(none->prompts[0].params.max_tokens, 16);
}

TEST(OpenAiProtocol, CompletionStream) {
  PAGODA_STORIES(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r = accepted(parse_completion_request(
      R"({"prompt": ["Once", "upon"], "n": 2, "echo": true, "stream": true, "stream_options": {"include_usage": true}})",
      m->ctx));
  ASSERT_TRUE(r.has_value());
  ResponseBuilder b(*r, tok, "cmpl-3", 5);
  // Choice 3 (prompt 1, sequence 1) starts: the echo comes first.
  std::vector<json> e = events_of(b.stream_events(1, chunk(1, " there", {20})));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["object"], "text_completion");
  EXPECT_EQ(e[0]["id"], "cmpl-3");
  EXPECT_TRUE(e[0].contains("usage") && e[0]["usage"].is_null());
  ASSERT_EQ(e[0]["choices"].size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["index"], 3);
  EXPECT_EQ(e[0]["choices"][0]["text"], "upon there");
  EXPECT_TRUE(e[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(e[0]["choices"][0]["logprobs"].is_null());
  // Later chunks carry only their text; a chunk with nothing new sends nothing.
  e = events_of(b.stream_events(1, chunk(1, " friend", {21})));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["text"], " friend");
  EXPECT_EQ(b.stream_events(1, chunk(1, "", {})), "");
  // A first chunk that is also the last: echo, text, finish reason together.
  OutputChunk stop = last(0, "!", {22}, FinishReason::kStop, 2, 1);
  stop.stop_string = "!";
  e = events_of(b.stream_events(0, stop));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["index"], 0);
  EXPECT_EQ(e[0]["choices"][0]["text"], "Once!");
  EXPECT_EQ(e[0]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(e[0]["choices"][0]["stop_reason"], "!");
  b.stream_events(0, last(1, "a", {23}, FinishReason::kLength, 2, 1));
  b.stream_events(1, last(0, "b", {24}, FinishReason::kLength, 2, 1));
  EXPECT_FALSE(b.all_finished());
  e = events_of(b.stream_events(1, last(1, "", {}, FinishReason::kLength, 2, 3)));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["text"], "");
  EXPECT_EQ(e[0]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(b.all_finished());
  e = events_of(b.stream_end());
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["choices"], json::array());
  EXPECT_EQ(e[0]["usage"]["prompt_tokens"], 4);
  EXPECT_EQ(e[0]["usage"]["completion_tokens"], 6);
  EXPECT_EQ(e[0]["usage"]["total_tokens"], 10);
  EXPECT_EQ(e[1], "[DONE]");
}

TEST(OpenAiProtocol, CompletionStreamLogprobs) {
  PAGODA_STORIES(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r =
      accepted(parse_completion_request(R"({"prompt": "Once", "logprobs": 0, "echo": true, "stream": true})", m->ctx));
  ASSERT_TRUE(r.has_value());
  const std::vector<TokenId>& prompt = r->prompts[0].prompt_token_ids;
  ResponseBuilder b(*r, tok, "cmpl-4", 5);
  OutputChunk first = chunk(0, " a", {300});
  first.logprobs = {sampled(300, -1.0f)};
  first.prompt_logprobs = {sampled(prompt[1], -3.0f)};
  std::vector<json> e = events_of(b.stream_events(0, first));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_FALSE(e[0].contains("usage"));
  EXPECT_EQ(e[0]["choices"][0]["text"], "Once a");
  const json& lp = e[0]["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), prompt.size() + 1);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_EQ(lp["token_logprobs"][1], -3.0);
  // logprobs 0: just the chosen token.
  EXPECT_EQ(lp["top_logprobs"][prompt.size()], json({{piece(tok, 300), -1.0}}));
  int64_t offset = 0;
  for (TokenId id : prompt) offset += static_cast<int64_t>(piece(tok, id).size());
  offset += static_cast<int64_t>(piece(tok, 300).size());
  // Offsets continue across events; a token with no text yet still brings its logprob.
  OutputChunk held = chunk(0, "", {3 + 0xE2});
  held.logprobs = {sampled(3 + 0xE2, -0.1f)};
  e = events_of(b.stream_events(0, held));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["text"], "");
  EXPECT_EQ(e[0]["choices"][0]["logprobs"]["text_offset"], json::array({offset}));
  e = events_of(b.stream_end());
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0], "[DONE]");
}

TEST(OpenAiProtocol, ChatResponse) {
  PAGODA_QWEN3(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r = accepted(parse_chat_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "n": 2, "logprobs": true, "top_logprobs": 1})", m->ctx));
  ASSERT_TRUE(r.has_value());
  const TokenId hello = tok.encode("Hello", false).at(0);
  const TokenId euro_part = tok.encode("\xE2\x82\xAC", false).at(0);  // the first token of "€"
  ResponseBuilder b(*r, tok, "chatcmpl-1", 9);
  OutputChunk c0 = last(0, "Hello", {hello, 151645}, FinishReason::kStop, 9, 2);
  c0.stop_token = 151645;  // <|im_end|> is Qwen3's EOS: stop_reason null
  c0.logprobs = {sampled(hello, -0.5f, {{hello, -0.5f}}), sampled(151645, -0.01f, {{151645, -0.01f}})};
  b.add(0, c0);
  OutputChunk c1 = last(1, "\xE2\x82\xAC", {euro_part}, FinishReason::kStop, 9, 1);
  c1.stop_token = 151643;  // <|endoftext|>: another stop id, reported
  c1.logprobs = {sampled(euro_part, -1.0f, {{hello, -0.2f}})};
  b.add(0, c1);
  ASSERT_TRUE(b.all_finished());
  json j = json::parse(b.body());
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "qwen3");
  ASSERT_EQ(j["choices"].size(), 2u);
  EXPECT_EQ(j["choices"][0]["message"], json({{"role", "assistant"}, {"content", "Hello"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["stop_reason"].is_null());
  EXPECT_EQ(j["choices"][1]["stop_reason"], 151643);
  const json& content = j["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Hello");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json({72, 101, 108, 108, 111}));
  EXPECT_EQ(content[0]["top_logprobs"],
            json::parse(R"([{"token": "Hello", "logprob": -0.5, "bytes": [72, 101, 108, 108, 111]}])"));
  EXPECT_EQ(content[1]["token"], "<|im_end|>");
  // Raw bytes, even when the token's text alone is not valid UTF-8.
  const json& euro = j["choices"][1]["logprobs"]["content"][0];
  json expected_bytes = json::array();
  for (char ch : tok.token_bytes(euro_part)) expected_bytes.push_back(static_cast<uint8_t>(ch));
  EXPECT_EQ(euro["bytes"], expected_bytes);
  EXPECT_EQ(euro["top_logprobs"][0]["token"], "Hello");
  EXPECT_EQ(j["usage"], json::parse(R"({"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12,
                                         "prompt_tokens_details": {"cached_tokens": 0}})"));
  // Without logprobs the field is null.
  const std::optional<ParsedRequest> plain =
      accepted(parse_chat_request(R"({"messages": [{"role": "user", "content": "hi"}]})", m->ctx));
  ASSERT_TRUE(plain.has_value());
  ResponseBuilder b2(*plain, tok, "chatcmpl-2", 9);
  b2.add(0, last(0, "ok", {hello}, FinishReason::kLength, 9, 1));
  json j2 = json::parse(b2.body());
  EXPECT_TRUE(j2["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j2["choices"][0]["finish_reason"], "length");
}

TEST(OpenAiProtocol, ChatStream) {
  PAGODA_QWEN3(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r = accepted(parse_chat_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": true,
          "stream_options": {"include_usage": true}})",
      m->ctx));
  ASSERT_TRUE(r.has_value());
  ResponseBuilder b(*r, tok, "chatcmpl-3", 11);
  // The first chunk of each choice is preceded by the role delta.
  std::vector<json> e = events_of(b.stream_events(0, chunk(1, "Hi", {1})));
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(e[0]["choices"][0]["index"], 1);
  EXPECT_EQ(e[0]["choices"][0]["delta"], json({{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(e[0]["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(e[0]["usage"].is_null());
  EXPECT_EQ(e[1]["choices"][0]["delta"], json({{"content", "Hi"}}));
  EXPECT_TRUE(e[1]["choices"][0]["logprobs"].is_null());
  // Nothing new: no event.
  EXPECT_EQ(b.stream_events(0, chunk(1, "", {2})), "");
  e = events_of(b.stream_events(0, chunk(1, " there", {3})));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["delta"], json({{"content", " there"}}));
  // The last chunk with no text: an empty delta with the finish reason.
  OutputChunk stop = last(1, "", {}, FinishReason::kStop, 9, 3);
  stop.stop_string = "END";
  e = events_of(b.stream_events(0, stop));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["delta"], json::object());
  EXPECT_EQ(e[0]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(e[0]["choices"][0]["stop_reason"], "END");
  // Choice 0 starts and ends in one chunk: role, then content with the finish reason.
  e = events_of(b.stream_events(0, last(0, "Yo", {4}, FinishReason::kLength, 9, 1)));
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(e[1]["choices"][0]["delta"], json({{"content", "Yo"}}));
  EXPECT_EQ(e[1]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(b.all_finished());
  e = events_of(b.stream_end());
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(e[0]["choices"], json::array());
  EXPECT_EQ(e[0]["usage"]["prompt_tokens"], 9);
  EXPECT_EQ(e[0]["usage"]["completion_tokens"], 4);
  EXPECT_EQ(e[1], "[DONE]");
}

TEST(OpenAiProtocol, ChatStreamLogprobs) {
  PAGODA_QWEN3(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r = accepted(parse_chat_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "stream": true, "logprobs": true})", m->ctx));
  ASSERT_TRUE(r.has_value());
  ResponseBuilder b(*r, tok, "chatcmpl-4", 11);
  OutputChunk held = chunk(0, "", {3});  // a token whose text is still held back
  held.logprobs = {sampled(3, -0.25f)};
  std::vector<json> e = events_of(b.stream_events(0, held));
  ASSERT_EQ(e.size(), 2u);
  EXPECT_FALSE(e[1].contains("usage"));
  EXPECT_EQ(e[1]["choices"][0]["delta"], json({{"content", ""}}));
  ASSERT_EQ(e[1]["choices"][0]["logprobs"]["content"].size(), 1u);
  EXPECT_EQ(e[1]["choices"][0]["logprobs"]["content"][0]["logprob"], -0.25);
  EXPECT_EQ(e[1]["choices"][0]["logprobs"]["content"][0]["top_logprobs"], json::array());
}

TEST(OpenAiProtocol, OutputIsValidUtf8) {
  PAGODA_STORIES(m);
  const Tokenizer& tok = *m->tok;
  const std::optional<ParsedRequest> r =
      accepted(parse_completion_request(R"({"prompt": "a", "stream": true})", m->ctx));
  ASSERT_TRUE(r.has_value());
  ResponseBuilder b(*r, tok, "cmpl-\xff", 1);
  std::vector<json> e = events_of(b.stream_events(0, last(0, "bad \xC3 text \xff", {5}, FinishReason::kLength, 2, 1)));
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0]["choices"][0]["text"], "bad \xEF\xBF\xBD text \xEF\xBF\xBD");
  EXPECT_EQ(e[0]["id"], "cmpl-\xEF\xBF\xBD");
  ResponseBuilder whole(*r, tok, "cmpl-1", 1);
  whole.add(0, last(0, "bad \xC3 text \xff", {5}, FinishReason::kLength, 2, 1));
  const json body = json::parse(whole.body());  // throws on invalid UTF-8
  EXPECT_EQ(body["choices"][0]["text"], "bad \xEF\xBF\xBD text \xEF\xBF\xBD");
}

// ---- errors, tokenize, detokenize, models -------------------------------------------------------------

TEST(OpenAiProtocol, ErrorObjects) {
  ApiError e = bad_request("bad \xff value", "max_tokens", "context_length_exceeded");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.to_json(),
            "{\"error\":{\"message\":\"bad \xEF\xBF\xBD value\",\"type\":\"invalid_request_error\","
            "\"param\":\"max_tokens\",\"code\":\"context_length_exceeded\"}}");
  EXPECT_EQ(bad_request("x").to_json(),
            R"({"error":{"message":"x","type":"invalid_request_error","param":null,"code":null}})");
  ApiError unavailable;
  unavailable.status = 503;
  unavailable.type = "unavailable_error";
  unavailable.message = "engine \"failed\"\n";
  EXPECT_EQ(json::parse(unavailable.to_json())["error"]["message"], "engine \"failed\"\n");
  std::vector<json> events = events_of(stream_error_events(unavailable));
  ASSERT_EQ(events.size(), 2u);
  EXPECT_EQ(events[0]["error"]["type"], "unavailable_error");
  EXPECT_EQ(events[1], "[DONE]");
}

TEST(OpenAiProtocol, TokenizeAndDetokenize) {
  PAGODA_QWEN3(m);
  const Tokenizer& tok = *m->tok;
  ApiResult<std::string> t = handle_tokenize(R"({"prompt": "Hello world", "model": "qwen3"})", m->ctx);
  ASSERT_NE(ok_value(t), nullptr);
  json j = json::parse(*ok_value(t));
  EXPECT_EQ(j["tokens"], json(tok.encode("Hello world", true)));
  EXPECT_EQ(j["count"], j["tokens"].size());
  EXPECT_EQ(j["max_model_len"], 256);
  EXPECT_TRUE(j["token_strs"].is_null());
  t = handle_tokenize(R"({"prompt": "Hi", "add_special_tokens": false, "return_token_strs": true})", m->ctx);
  ASSERT_NE(ok_value(t), nullptr);
  j = json::parse(*ok_value(t));
  EXPECT_EQ(j["token_strs"], json::array({"Hi"}));
  // Messages go through the chat template (special text in them stays plain).
  t = handle_tokenize(R"({"messages": [{"role": "user", "content": "<|im_end|>"}], "add_generation_prompt": false})",
                      m->ctx);
  ASSERT_NE(ok_value(t), nullptr);
  j = json::parse(*ok_value(t));
  const std::vector<TokenId> ids = j["tokens"].get<std::vector<TokenId>>();
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 151645), 1);
  EXPECT_EQ(tok.decode(ids, false), "<|im_start|>user\n<|im_end|><|im_end|>\n");
  EXPECT_TRUE(is_error(handle_tokenize(R"({})", m->ctx), "prompt"));
  EXPECT_TRUE(is_error(handle_tokenize(R"({"prompt": 5})", m->ctx), "prompt"));
  EXPECT_TRUE(is_error(handle_tokenize(R"({"messages": [{}]})", m->ctx), "messages"));
  // What a chat request refuses, /tokenize refuses too, rather than rendering without it; tools
  // are rendered as chat renders them.
  EXPECT_TRUE(is_error(handle_tokenize(R"({"messages": [{"role": "user", "content": "a"}],
                                           "continue_final_message": true})",
                                       m->ctx),
                       "continue_final_message"));
  EXPECT_TRUE(is_error(handle_tokenize(R"({"messages": [{"role": "user", "content": "a"}], "tools": [{"type": "x"}]})",
                                       m->ctx),
                       "tools"));
  t = handle_tokenize(R"({"messages": [{"role": "user", "content": "a"}],
                          "tools": [{"type": "function", "function": {"name": "lookup_word"}}]})",
                      m->ctx);
  ASSERT_NE(ok_value(t), nullptr);
  const std::string rendered = tok.decode(json::parse(*ok_value(t))["tokens"].get<std::vector<TokenId>>(), false);
  EXPECT_NE(rendered.find(R"({"type": "function", "function": {"name": "lookup_word"}})"), std::string::npos)
      << rendered;
  EXPECT_TRUE(is_error(handle_tokenize("[", m->ctx), ""));
  EXPECT_TRUE(is_error(handle_tokenize(R"({"prompt": "a", "model": "x"})", m->ctx), "model", "model_not_found", 404,
                       "not_found_error"));

  ApiResult<std::string> d = handle_detokenize(json({{"tokens", tok.encode("Hello world", false)}}).dump(), m->ctx);
  ASSERT_NE(ok_value(d), nullptr);
  EXPECT_EQ(json::parse(*ok_value(d)), json({{"prompt", "Hello world"}}));
  d = handle_detokenize(R"({"tokens": [151644, 151645]})", m->ctx);
  ASSERT_NE(ok_value(d), nullptr);
  EXPECT_EQ(json::parse(*ok_value(d))["prompt"], "<|im_start|><|im_end|>");
  for (const char* bad : {R"({"tokens": [-1]})", R"({"tokens": [151669]})", R"({"tokens": [1.5]})",
                          R"({"tokens": "abc"})", R"({})", R"({"tokens": [18446744073709551615]})"}) {
    SCOPED_TRACE(bad);
    EXPECT_TRUE(is_error(handle_detokenize(bad, m->ctx), "tokens"));
  }
  EXPECT_TRUE(is_error(handle_detokenize(std::string(1000, '['), m->ctx), ""));
}

TEST(OpenAiProtocol, ModelsList) {
  PAGODA_STORIES(m);
  json j = json::parse(models_list(m->ctx, "/models/stories260K.gguf", 123));
  EXPECT_EQ(j, json::parse(R"({"object": "list", "data": [
      {"id": "stories", "object": "model", "created": 123, "owned_by": "pagoda",
       "root": "/models/stories260K.gguf", "parent": null, "max_model_len": 64},
      {"id": "stories-alias", "object": "model", "created": 123, "owned_by": "pagoda",
       "root": "/models/stories260K.gguf", "parent": null, "max_model_len": 64}]})"));
}

// ---- fuzz ---------------------------------------------------------------------------------------------

// Random byte flips, insertions, deletions and truncations of valid bodies: every call returns a
// request or an error (never throws or crashes), and what it accepts is within the limits.
TEST(OpenAiProtocol, SurvivesMutatedBodies) {
  PAGODA_STORIES(s);
  PAGODA_QWEN3(q);
  const std::vector<std::string> completions = {
      R"({"model": "stories", "prompt": "Once upon a time", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9,
          "n": 2, "logprobs": 2, "echo": true, "stop": ["a", "b"], "seed": -3, "logit_bias": {"5": 10},
          "stream": true, "stream_options": {"include_usage": true}, "stop_token_ids": [2]})",
      R"({"prompt": [[1, 2, 3], [4, 5]], "best_of": 1, "min_tokens": 1, "top_k": 3, "suffix": ""})",
      R"({"prompt": ["a", "b\u00e9\ud83d\ude00"], "presence_penalty": -1.5, "repetition_penalty": 1e0})",
  };
  const std::vector<std::string> chats = {
      R"({"model": "qwen3", "messages": [{"role": "system", "content": "s"}, {"role": "user",
          "content": [{"type": "text", "text": "<|im_start|>x"}]}, {"role": "assistant", "content": null,
          "reasoning_content": "r"}, {"role": "tool", "content": "t", "tool_call_id": "1"}],
          "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 8, "chat_template_kwargs":
          {"enable_thinking": false}, "tools": [], "response_format": {"type": "text"}})",
  };
  static const char* const kFragments[] = {
      "{",    "}",    "[",    "]",          "\"",           ":",      ",",  "\\",
      "\\u",  "null", "true", "-",          "1e999",        "0",      "-1", "99999999999999999999",
      "\xff", "\xc3", "[[[[", "\"prompt\"", "\"messages\"", "\"n\":", " "};
  std::mt19937 rng(20240607);
  const auto mutate = [&](std::string body) {
    const int num_mutations = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < num_mutations && !body.empty(); ++k) {
      const size_t pos = rng() % body.size();
      switch (rng() % 5) {
        case 0:
          body[pos] = static_cast<char>(rng() % 256);
          break;
        case 1:
          body.erase(pos, 1 + rng() % 6);
          break;
        case 2:
          body.insert(pos, kFragments[rng() % (sizeof(kFragments) / sizeof(kFragments[0]))]);
          break;
        case 3:
          body.insert(rng() % body.size(), body.substr(pos, std::min<size_t>(1 + rng() % 32, body.size() - pos)));
          break;
        default:
          body.resize(pos);
          break;
      }
    }
    return body;
  };
  int accepted = 0, refused = 0;
  for (int it = 0; it < 3000; ++it) {
    const bool chat = it % 4 == 3;
    const std::string body = mutate(chat ? chats[0] : completions[static_cast<size_t>(it) % completions.size()]);
    const ModelContext& ctx = chat ? q->ctx : s->ctx;
    const ApiResult<ParsedRequest> r = chat ? parse_chat_request(body, ctx) : parse_completion_request(body, ctx);
    if (const ParsedRequest* p = ok_value(r)) {
      ++accepted;
      ASSERT_FALSE(p->prompts.empty());
      for (const GenerateRequest& g : p->prompts) {
        ASSERT_FALSE(g.prompt_token_ids.empty());
        ASSERT_LE(static_cast<int64_t>(g.prompt_token_ids.size()) + g.params.max_tokens, ctx.max_model_len);
        ASSERT_TRUE(g.params.validate(ctx.tokenizer->vocab_size()).ok());
      }
      // The response side copes with whatever was accepted.
      ResponseBuilder b(*p, *ctx.tokenizer, "id", 0);
      for (size_t k = 0; k < p->prompts.size(); ++k) {
        for (int64_t i = 0; i < p->n; ++i) {
          OutputChunk c = last(i, body.substr(0, 8), {1}, FinishReason::kLength, 1, 1);
          if (p->logprobs) c.logprobs = {sampled(1, -1.0f, {{2, -0.5f}})};
          b.stream_events(k, c);
        }
      }
      ASSERT_TRUE(b.all_finished());
      ASSERT_FALSE(json::parse(b.body(), nullptr, false).is_discarded());
    } else {
      ++refused;
      const ApiError& e = std::get<ApiError>(r);
      ASSERT_TRUE(e.status == 400 || e.status == 404) << e.status;
      ASSERT_FALSE(json::parse(e.to_json(), nullptr, false).is_discarded());
    }
    using Handler = ApiResult<std::string> (*)(std::string_view, const ModelContext&);
    for (Handler handler : {&handle_tokenize, &handle_detokenize}) {
      const ApiResult<std::string> t = handler(body, ctx);
      if (const std::string* out = ok_value(t)) {
        ASSERT_FALSE(json::parse(*out, nullptr, false).is_discarded());
      }
    }
  }
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 1000);
}

// The sampling fields alone (Python's SamplingParams when it is made): the server's rules and
// messages, without the bounds that only a model sets.
TEST(OpenAiProtocol, SamplingFieldsAreCheckedWithoutAModel) {
  EXPECT_EQ(sampling_fields_problem(R"({"temperature": 0.5, "top_k": 40, "max_tokens": 8, "stop": ["x"]})"),
            std::nullopt);
  EXPECT_EQ(sampling_fields_problem(R"({"temperature": -1})"), "temperature must be in [0, 2], got -1");
  EXPECT_EQ(sampling_fields_problem(R"({"max_tokens": 0})"), "max_tokens must be >= 1, got 0");
  EXPECT_EQ(sampling_fields_problem(R"({"max_tokens": 4, "min_tokens": 5})"),
            "min_tokens must be in [0, max_tokens = 4], got 5");
  EXPECT_NE(sampling_fields_problem(R"({"top_p": "high"})").value_or("").find("top_p"), std::string::npos);
  EXPECT_TRUE(sampling_fields_problem("{").has_value());
  // Ids and logprobs wait for the model's vocabulary and --max-logprobs.
  EXPECT_EQ(sampling_fields_problem(R"({"stop_token_ids": [1000000], "logprobs": 50})"), std::nullopt);
  EXPECT_TRUE(sampling_fields_problem(R"({"stop_token_ids": [-1]})").has_value());
}

// ---- structured outputs ----------------------------------------------------------------------------

// The grammar a parsed completions body carries: whether it takes `text` whole.
bool constraint_takes(const ParsedRequest& r, const std::string& text) {
  const auto& c = r.prompts.at(0).constraint;
  if (!c) return false;
  structured::GrammarMatcher m(c->grammar->grammar());
  return m.accept(text) && m.can_end();
}

TEST(OpenAiProtocol, StructuredOutputFieldsCompileOneConstraint) {
  PAGODA_QWEN3(q);
  struct Case {
    std::string fields;
    std::vector<std::string> good, bad;
  };
  const std::vector<Case> cases = {
      {R"("response_format": {"type": "json_object"})", {R"({"a": [1]})", "{}"}, {"[]", "1"}},
      // Properties in the order written (b before a), not in the JSON library's sorted order.
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "r", "strict": true, "schema":
           {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
            "required": ["b", "a"], "additionalProperties": false}}})",
       {R"({"b": 1, "a": "x"})"}, {R"({"a": "x", "b": 1})", R"({"b": 1})"}},
      {R"("structured_outputs": {"json": "{\"enum\": [\"x\", \"y\"]}"})", {R"("x")"}, {R"("z")"}},
      {R"("structured_outputs": {"json": {"type": "integer", "maximum": 5}, "disable_any_whitespace": true})",
       {"5", "-3"}, {"6"}},
      {R"("structured_outputs": {"regex": "[a-c]{2}\\d"})", {"ab1"}, {"ab", "abd"}},
      {R"("structured_outputs": {"choice": ["yes", "no"]})", {"yes", "no"}, {"maybe"}},
      {R"("structured_outputs": {"grammar": "root ::= \"a\" [0-9]+"})", {"a12"}, {"a"}},
      {R"("structured_outputs": {"json_object": true})", {"{}"}, {"1"}},
      {R"("guided_json": {"type": "boolean"})", {"true"}, {"1"}},
      {R"("guided_regex": "x+")", {"xxx"}, {"y"}},
      {R"("guided_choice": ["a", "b"])", {"b"}, {"c"}},
      {R"("guided_grammar": "root ::= \"z\"")", {"z"}, {"zz"}},
  };
  for (const Case& c : cases) {
    const std::string body = R"({"prompt": "a", )" + c.fields + "}";
    SCOPED_TRACE(body);
    auto r = accepted(parse_completion_request(body, q->ctx));
    ASSERT_TRUE(r.has_value()) << error_message(parse_completion_request(body, q->ctx));
    for (const std::string& t : c.good) EXPECT_TRUE(constraint_takes(*r, t)) << t;
    for (const std::string& t : c.bad) EXPECT_FALSE(constraint_takes(*r, t)) << t;
  }
  // Whitespace: any by default, none with disable_any_whitespace (the request's or the server's).
  const std::string schema = R"({"type": "object", "properties": {"k": {"type": "integer"}}, "required": ["k"]})";
  auto loose = accepted(parse_completion_request(R"({"prompt": "a", "guided_json": )" + schema + "}", q->ctx));
  auto tight = accepted(parse_completion_request(
      R"({"prompt": "a", "structured_outputs": {"json": )" + schema + R"(, "disable_any_whitespace": true}})", q->ctx));
  ASSERT_TRUE(loose && tight);
  EXPECT_TRUE(constraint_takes(*loose, "{ \"k\" : 1 }"));
  EXPECT_FALSE(constraint_takes(*tight, "{ \"k\" : 1 }"));
  EXPECT_TRUE(constraint_takes(*tight, "{\"k\":1}"));
  ModelContext compact = q->ctx;
  compact.structured.config.disable_any_whitespace = true;
  auto server_wide = accepted(parse_completion_request(R"({"prompt": "a", "guided_json": )" + schema + "}", compact));
  ASSERT_TRUE(server_wide);
  EXPECT_FALSE(constraint_takes(*server_wide, "{ \"k\" : 1 }"));
  // The same constraint again is the compiled one: no second compile.
  const int64_t compiled = q->grammars->num_compiled();
  EXPECT_TRUE(accepted(parse_completion_request(R"({"prompt": "b", "guided_json": )" + schema + "}", q->ctx)));
  EXPECT_EQ(q->grammars->num_compiled(), compiled);
  // Chat takes them too.
  auto chat = accepted(parse_chat_request(
      R"({"messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "json_object"}})", q->ctx));
  ASSERT_TRUE(chat);
  EXPECT_TRUE(chat->prompts[0].constraint.has_value());
}

TEST(OpenAiProtocol, StructuredOutputErrorsNameWhatIsRefused) {
  PAGODA_QWEN3(q);
  struct Case {
    std::string fields, param, in_message;
  };
  const std::vector<Case> cases = {
      {R"("guided_json": {"type": "integer", "multipleOf": 3})", "guided_json", "'multipleOf' is not supported"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
           "properties": {"a": {"not": {}}}}}})",
       "response_format", "at #/properties/a: 'not' is not supported"},
      {R"x("guided_regex": "a(?=b)")x", "guided_regex", "lookahead '(?=' at offset 1"},
      {R"("structured_outputs": {"grammar": "root ::= \"a"})", "structured_outputs", "GBNF: line 1"},
      {R"("structured_outputs": {"regex": "a", "choice": ["b"]})", "structured_outputs", "one constraint"},
      {R"("guided_regex": "a", "guided_choice": ["b"])", "guided_choice", "guided_regex and guided_choice"},
      {R"("response_format": {"type": "json_object"}, "guided_json": {})", "guided_json", "one structured output"},
      {R"("structured_outputs": {"structural_tag": "x"})", "structured_outputs", "structural_tag is not supported"},
      {R"("structured_outputs": {"choice": []})", "structured_outputs", "non-empty array"},
      {R"("structured_outputs": {"json": "{not json"})", "structured_outputs", "not valid JSON"},
      {R"("guided_whitespace_pattern": "[ ]*")", "guided_whitespace_pattern", "not supported"},
      {R"("response_format": {"type": "json_schema", "json_schema": {"name": "x"}})", "response_format", "schema"},
  };
  for (const Case& c : cases) {
    const std::string body = R"({"prompt": "a", )" + c.fields + "}";
    SCOPED_TRACE(body);
    auto r = parse_completion_request(body, q->ctx);
    EXPECT_TRUE(is_error(r, c.param));
    EXPECT_NE(error_message(r).find(c.in_message), std::string::npos) << error_message(r);
  }
  // Deep schemas in a string are bounded like bodies.
  std::string deep = "1";
  for (int i = 0; i < 100; ++i) deep = "[" + deep + "]";
  EXPECT_TRUE(is_error(parse_completion_request(R"({"prompt": "a", "guided_json": ")" + deep + "\"}", q->ctx),
                       "guided_json"));
  // Large schemas (this one 600 KB): too many keys to keep in order, or too many values, are 400s.
  std::string many = R"({"prompt": "a", "guided_json": {"type": "object", "properties": {)";
  for (int i = 0; i < 25000; ++i) many += (i ? ",\"p" : "\"p") + std::to_string(i) + R"(": {"type": "null"})";
  many += "}}}";
  auto many_keys = parse_completion_request(many, q->ctx);
  EXPECT_TRUE(is_error(many_keys, "guided_json"));
  EXPECT_NE(error_message(many_keys).find("more than 20000 keys"), std::string::npos) << error_message(many_keys);
  std::string values = R"({"prompt": "a", "guided_json": {"enum": [)";
  for (int i = 0; i < 5000; ++i) values += (i ? ",\"" : "\"") + std::string(10, 'a' + i % 26) + std::to_string(i) + "\"";
  values += "]}}";
  auto many_values = parse_completion_request(values, q->ctx);
  EXPECT_TRUE(is_error(many_values, "guided_json"));
  EXPECT_NE(error_message(many_values).find("more than 4096 values"), std::string::npos) << error_message(many_values);
  // Without a compiler (no vocabulary), a constraint is a 400, never ignored.
  ModelContext none = q->ctx;
  none.structured.grammars = nullptr;
  auto r = parse_completion_request(R"({"prompt": "a", "guided_choice": ["a"]})", none);
  EXPECT_TRUE(is_error(r, "guided_choice"));
  EXPECT_NE(error_message(r).find("not available"), std::string::npos);
}

// ---- tools and reasoning ---------------------------------------------------------------------------

constexpr const char* kWeatherTools = R"([{"type": "function", "function": {"name": "get_weather",
    "description": "Weather in a city", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "unit": {"enum": ["c", "f"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}])";

// A Qwen3 context with the hermes tool parser and the qwen3 reasoning parser, as `pagoda serve
// --enable-auto-tool-choice --tool-call-parser hermes --reasoning-parser qwen3` has it.
struct AgentContext {
  std::unique_ptr<ToolParser> tools;
  std::unique_ptr<ReasoningParser> reasoning;
  ModelContext ctx;
};
AgentContext agent_context(const Model& m) {
  AgentContext a;
  a.tools = std::move(make_tool_parser("hermes")).value();
  a.reasoning = std::move(make_reasoning_parser("qwen3")).value();
  a.ctx = m.ctx;
  a.ctx.tools.parser = a.tools.get();
  a.ctx.tools.enable_auto_tool_choice = true;
  a.ctx.reasoning = a.reasoning.get();
  const std::vector<TokenId> end = m.tok->encode("</think>", false);
  if (end.size() == 1) a.ctx.reasoning_end_token = end[0];
  return a;
}

std::string chat_body(const std::string& extra) {
  return R"({"messages": [{"role": "user", "content": "Weather in Paris?"}], )" + extra + "}";
}

TEST(OpenAiProtocol, ToolsReachTheTemplateAndToolChoiceIsChecked) {
  PAGODA_QWEN3(q);
  const AgentContext a = agent_context(*q);
  const std::string tools = std::string(R"("tools": )") + kWeatherTools;
  // auto (the default with tools) needs the server's flags.
  EXPECT_TRUE(is_error(parse_chat_request(chat_body(tools), q->ctx), "tool_choice"));
  auto r = accepted(parse_chat_request(chat_body(tools), a.ctx));
  ASSERT_TRUE(r) << error_message(parse_chat_request(chat_body(tools), a.ctx));
  EXPECT_EQ(r->tools.choice, ToolRequest::Choice::kAuto);
  EXPECT_EQ(r->tool_parser, a.tools.get());
  EXPECT_FALSE(r->prompts[0].constraint.has_value());
  // Qwen3's template lists the tools, their keys in the order written.
  const std::string& prompt = r->prompt_texts[0];
  EXPECT_NE(prompt.find("<tools>"), std::string::npos) << prompt;
  EXPECT_NE(prompt.find(R"({"type": "function", "function": {"name": "get_weather", "description": "Weather in a city")"),
            std::string::npos)
      << prompt;
  // A conversation with calls and results is rendered as the model was trained on it.
  auto turn = accepted(parse_chat_request(R"({"messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18C"}], )" + tools + "}",
                                          a.ctx));
  ASSERT_TRUE(turn);
  EXPECT_NE(turn->prompt_texts[0].find("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"),
            std::string::npos)
      << turn->prompt_texts[0];
  EXPECT_NE(turn->prompt_texts[0].find("<tool_response>\n18C\n</tool_response>"), std::string::npos);
  // Refusals name the field.
  for (const auto& [extra, param] : std::vector<std::pair<std::string, std::string>>{
           {R"("tool_choice": "required")", "tool_choice"},  // no tools
           {tools + R"(, "tool_choice": "sometimes")", "tool_choice"},
           {tools + R"(, "tool_choice": {"type": "function", "function": {"name": "nope"}})", "tool_choice"},
           {R"("tools": [{"type": "function", "function": {}}])", "tools"},
           {R"("tools": [{"type": "retrieval"}])", "tools"},
           {R"("tools": {"a": 1})", "tools"},
           {tools + R"(, "tool_choice": "required", "response_format": {"type": "json_object"})", "tool_choice"},
           {R"("messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": 5}}]}])",
            "messages"},
           {R"("messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": ")" +
                std::string(100, '[') + std::string(100, ']') + R"("}}]}])",
            "messages"},
       }) {
    const std::string body = extra.rfind(R"("messages")", 0) == 0 ? "{" + extra + "}" : chat_body(extra);
    SCOPED_TRACE(body);
    EXPECT_TRUE(is_error(parse_chat_request(body, a.ctx), param)) << error_message(parse_chat_request(body, a.ctx));
  }
  // none: the template still sees the tools, nothing is parsed or forced.
  auto none = accepted(parse_chat_request(chat_body(tools + R"(, "tool_choice": "none")"), q->ctx));
  ASSERT_TRUE(none);
  EXPECT_EQ(none->tools.choice, ToolRequest::Choice::kNone);
  EXPECT_EQ(none->tool_parser, nullptr);
}

TEST(OpenAiProtocol, ForcedToolChoiceIsAGrammarAndItsCallsParse) {
  PAGODA_QWEN3(q);
  const std::string tools = std::string(R"("tools": )") + kWeatherTools;
  // A named function: the answer is its arguments object.
  auto named = accepted(parse_chat_request(
      chat_body(tools + R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"), q->ctx));
  ASSERT_TRUE(named);
  EXPECT_TRUE(constraint_takes(*named, R"({"city": "Paris", "unit": "c"})"));
  EXPECT_FALSE(constraint_takes(*named, R"({"unit": "c"})"));  // city is required
  EXPECT_FALSE(constraint_takes(*named, R"({"a": 1, "b": 2})"));
  // required: an array of calls of the listed functions, one only without parallel calls.
  auto required = accepted(parse_chat_request(chat_body(tools + R"(, "tool_choice": "required")"), q->ctx));
  ASSERT_TRUE(required);
  const std::string two = R"([{"name": "get_weather", "parameters": {"city": "Rome"}}, {"name": "add", "parameters": {"a": 1, "b": 2}}])";
  EXPECT_TRUE(constraint_takes(*required, two));
  EXPECT_FALSE(constraint_takes(*required, "[]"));
  EXPECT_FALSE(constraint_takes(*required, R"([{"name": "nope", "parameters": {}}])"));
  EXPECT_FALSE(constraint_takes(*required, R"([{"name": "add", "parameters": {"a": 1}}])"));
  auto single = accepted(parse_chat_request(
      chat_body(tools + R"(, "tool_choice": "required", "parallel_tool_calls": false)"), q->ctx));
  ASSERT_TRUE(single);
  EXPECT_FALSE(constraint_takes(*single, two));
  EXPECT_TRUE(constraint_takes(*single, R"([{"name": "add", "parameters": {"a": 1, "b": 2}}])"));

  // The response: the calls, with ids, finish_reason tool_calls; whole and streamed alike.
  const Tokenizer& tok = *q->tok;
  ResponseBuilder whole(*required, tok, "chatcmpl-t1", 5);
  whole.add(0, last(0, two, {1, 2}, FinishReason::kStop, 9, 2));
  json j = json::parse(whole.body());
  const json& msg = j["choices"][0]["message"];
  EXPECT_TRUE(msg["content"].is_null());
  ASSERT_EQ(msg["tool_calls"].size(), 2u);
  EXPECT_EQ(msg["tool_calls"][0]["type"], "function");
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Rome"}}));
  EXPECT_EQ(json::parse(msg["tool_calls"][1]["function"]["arguments"].get<std::string>()), json({{"a", 1}, {"b", 2}}));
  EXPECT_NE(msg["tool_calls"][0]["id"], msg["tool_calls"][1]["id"]);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");

  auto streamed = accepted(parse_chat_request(
      chat_body(tools + R"(, "stream": true, "tool_choice": {"type": "function", "function": {"name": "get_weather"}})"),
      q->ctx));
  ASSERT_TRUE(streamed);
  ResponseBuilder sb(*streamed, tok, "chatcmpl-t2", 5);
  std::string arguments;
  std::vector<json> all;
  const std::string answer = R"({"city": "Paris"})";
  for (size_t k = 0; k < answer.size(); k += 3) {
    const std::string piece = answer.substr(k, 3);
    const bool end = k + 3 >= answer.size();
    for (json& e : events_of(sb.stream_events(0, end ? last(0, piece, {1}, FinishReason::kStop, 9, 6) : chunk(0, piece, {1})))) {
      all.push_back(e);
    }
  }
  int with_name = 0;
  for (const json& e : all) {
    const json& d = e["choices"][0]["delta"];
    if (!d.contains("tool_calls")) continue;
    const json& call = d["tool_calls"][0];
    EXPECT_EQ(call["index"], 0);
    if (call["function"].contains("name")) {
      ++with_name;
      EXPECT_EQ(call["function"]["name"], "get_weather");
      EXPECT_EQ(call["type"], "function");
      EXPECT_TRUE(call["id"].is_string());
    }
    arguments += call["function"]["arguments"].get<std::string>();
  }
  EXPECT_EQ(with_name, 1);
  EXPECT_EQ(arguments, answer);
  EXPECT_EQ(all.back()["choices"][0]["finish_reason"], "stop");  // a named function: "stop", as OpenAI's
  ResponseBuilder named_whole(*named, tok, "chatcmpl-t3", 5);
  named_whole.add(0, last(0, answer, {1}, FinishReason::kStop, 9, 6));
  json nj = json::parse(named_whole.body());
  EXPECT_EQ(nj["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(nj["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], answer);

  // A tool's own $defs (Pydantic writes them) inside the required array, and arguments as written
  // (a 23-digit integer is not re-spelled through a double); parameters without a type are an object.
  const std::string defs_tools = R"("tools": [{"type": "function", "function": {"name": "t", "parameters":
      {"$defs": {"P": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
       "type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"]}}},
      {"type": "function", "function": {"name": "u", "parameters": {"description": "no type"}}}])";
  auto defs = accepted(parse_chat_request(chat_body(defs_tools + R"(, "tool_choice": "required")"), q->ctx));
  ASSERT_TRUE(defs) << error_message(parse_chat_request(chat_body(defs_tools + R"(, "tool_choice": "required")"), q->ctx));
  const std::string big = R"([{"name": "t", "parameters": {"p": {"x": 12345678901234567890123}}}, {"name": "u", "parameters": {}}])";
  EXPECT_TRUE(constraint_takes(*defs, big));
  EXPECT_FALSE(constraint_takes(*defs, R"([{"name": "t", "parameters": {"p": {"y": 1}}}])"));
  EXPECT_FALSE(constraint_takes(*defs, R"([{"name": "u", "parameters": 1}])"));
  ResponseBuilder db(*defs, tok, "chatcmpl-t4", 5);
  db.add(0, last(0, big, {1}, FinishReason::kStop, 9, 6));
  json dj = json::parse(db.body());
  EXPECT_EQ(dj["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
            R"({"p": {"x": 12345678901234567890123}})");
  EXPECT_EQ(dj["choices"][0]["message"]["tool_calls"][1]["function"]["arguments"], "{}");
}

TEST(OpenAiProtocol, AutoToolCallsAndReasoningInTheAnswer) {
  PAGODA_QWEN3(q);
  const AgentContext a = agent_context(*q);
  ASSERT_TRUE(a.ctx.reasoning_end_token.has_value()) << "</think> is one token of Qwen3's vocabulary";
  const std::string tools = std::string(R"("tools": )") + kWeatherTools;
  const std::string text = "<think>\nThe user wants weather.\n</think>\n\nChecking.\n<tool_call>\n"
                           "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
  auto r = accepted(parse_chat_request(chat_body(tools), a.ctx));
  ASSERT_TRUE(r);
  const Tokenizer& tok = *q->tok;
  ResponseBuilder whole(*r, tok, "chatcmpl-a1", 5);
  whole.add(0, last(0, text, {1}, FinishReason::kStop, 9, 30));
  json j = json::parse(whole.body());
  const json& msg = j["choices"][0]["message"];
  EXPECT_EQ(msg["reasoning_content"], "\nThe user wants weather.\n");
  EXPECT_EQ(msg["reasoning"], msg["reasoning_content"]);
  ASSERT_EQ(msg["tool_calls"].size(), 1u);
  EXPECT_EQ(msg["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(msg["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_NE(msg["content"].get<std::string>().find("Checking."), std::string::npos);

  // Streamed in pieces of every size, the deltas add up to the same message.
  for (size_t size = 1; size <= text.size(); size += 7) {
    auto s = accepted(parse_chat_request(chat_body(tools + R"(, "stream": true)"), a.ctx));
    ASSERT_TRUE(s);
    ResponseBuilder b(*s, tok, "chatcmpl-a1", 5);
    std::string content, reasoning, name, arguments, id;
    for (size_t k = 0; k < text.size(); k += size) {
      const bool end = k + size >= text.size();
      const std::string piece = text.substr(k, size);
      for (const json& e : events_of(b.stream_events(0, end ? last(0, piece, {1}, FinishReason::kStop, 9, 30)
                                                             : chunk(0, piece, {1})))) {
        const json& d = e["choices"][0]["delta"];
        if (d.contains("content")) content += d["content"].get<std::string>();
        if (d.contains("reasoning_content")) reasoning += d["reasoning_content"].get<std::string>();
        for (const json& c : d.value("tool_calls", json::array())) {
          if (c["function"].contains("name")) {
            name += c["function"]["name"].get<std::string>();
            id = c["id"];
          }
          arguments += c["function"]["arguments"].get<std::string>();
        }
        if (end && e["choices"][0]["finish_reason"].is_string()) {
          EXPECT_EQ(e["choices"][0]["finish_reason"], "tool_calls");
        }
      }
    }
    SCOPED_TRACE(size);
    EXPECT_EQ(content, msg["content"].get<std::string>());
    EXPECT_EQ(reasoning, msg["reasoning_content"].get<std::string>());
    EXPECT_EQ(name, "get_weather");
    EXPECT_EQ(arguments, msg["tool_calls"][0]["function"]["arguments"].get<std::string>());
    EXPECT_EQ(id, msg["tool_calls"][0]["id"]);
  }

  // A structured output starts after the thinking; with thinking off, from the start.
  auto thinking = accepted(parse_chat_request(chat_body(R"("response_format": {"type": "json_object"})"), a.ctx));
  ASSERT_TRUE(thinking);
  EXPECT_EQ(thinking->prompts[0].constraint->after_token, a.ctx.reasoning_end_token);
  auto off = accepted(parse_chat_request(
      chat_body(R"("response_format": {"type": "json_object"}, "chat_template_kwargs": {"enable_thinking": false})"),
      a.ctx));
  ASSERT_TRUE(off);
  EXPECT_FALSE(off->prompts[0].constraint->after_token.has_value());
}

TEST(OpenAiProtocol, StructuredOutputsConfigFlag) {
  auto c = parse_structured_outputs_config(R"({"backend": "xgrammar", "disable_any_whitespace": true})");
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->disable_any_whitespace);
  EXPECT_EQ(c->backend, "xgrammar");
  EXPECT_FALSE(parse_structured_outputs_config(R"({"backend": "mine"})").ok());
  EXPECT_FALSE(parse_structured_outputs_config(R"({"whitespace": 1})").ok());
  EXPECT_FALSE(parse_structured_outputs_config("[").ok());
  EXPECT_FALSE(parse_structured_outputs_config(R"({"disable_additional_properties": false})").ok());
}

}  // namespace
}  // namespace pagoda::server
