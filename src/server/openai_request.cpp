// OpenAI protocol, requests: parsing and validating the bodies of the generation endpoints,
// /tokenize and /detokenize.
//
// Parsing reads a body in three stages: a byte scan that refuses deep nesting (the JSON
// library's own recursion is never reached), nlohmann's parser (every exception it throws is
// caught here), then typed field readers that never call get<T>() on a value whose type they
// have not checked. Each check names the field it failed on, so the error carries `param`.
#include "server/openai_request.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <new>
#include <random>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "engine/request_validation.h"

namespace pagoda::server {

namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;  // the /tokenize answers keep their field order

// Caps that the API reference leaves open; generous for real clients, small enough that no
// request can make the engine scan megabytes per generated token.
constexpr size_t kMaxModelNameBytes = 1024;
constexpr size_t kMaxStopStringBytes = 4096;
constexpr size_t kMaxStopTokenIds = 1024;
constexpr size_t kMaxEchoedBytes = 64;  // of user text quoted back in an error message
constexpr double kMaxTemperature = 2.0;

// `s` cut to a few bytes (at a character boundary) for quoting in a message.
std::string quote(std::string_view s) {
  if (s.size() <= kMaxEchoedBytes) return "'" + std::string(s) + "'";
  size_t cut = kMaxEchoedBytes;
  while (cut > 0 && (static_cast<uint8_t>(s[cut]) & 0xC0) == 0x80) --cut;
  return "'" + std::string(s.substr(0, cut)) + "...'";
}

const char* type_name(const json& j) {
  switch (j.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a decimal number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

ApiError wrong_type(const std::string& key, const char* expected, const json& got) {
  return bad_request(
      "Invalid type for '" + key + "': expected " + expected + ", but got " + type_name(got) + " instead.", key);
}

// A JSON library exception's message, without its "[json.exception.x.n] " prefix and cut short
// (it may quote the body).
std::string describe(const json::exception& e) {
  std::string_view what = e.what();
  if (!what.empty() && what[0] == '[' && what.find("] ") != std::string_view::npos) {
    what.remove_prefix(what.find("] ") + 2);
  }
  if (what.size() <= 200) return std::string(what);
  return std::string(what.substr(0, 200)) + "...";
}

std::string fmt(double v) {
  std::string s = std::to_string(v);
  s.erase(s.find_last_not_of('0') + 1);
  if (!s.empty() && s.back() == '.') s.pop_back();
  return s;
}

// ---- reading fields ---------------------------------------------------------------------------
// A reader leaves `out` alone when the field is absent or null (null means "not given", as in
// the OpenAI SDKs), and returns an error when it has the wrong type.

using MaybeError = std::optional<ApiError>;

#define PAGODA_RETURN_IF_API_ERROR(expr)         \
  do {                                           \
    if (MaybeError pagoda_api_error_ = (expr)) { \
      return *std::move(pagoda_api_error_);      \
    }                                            \
  } while (0)

const json* field(const json& body, const std::string& key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

MaybeError read_bool(const json& body, const std::string& key, bool& out) {
  const json* v = field(body, key);
  if (!v) return {};
  if (!v->is_boolean()) return wrong_type(key, "a boolean", *v);
  out = v->get<bool>();
  return {};
}

// JSON integers only: a decimal number, even 10.0, is refused rather than truncated.
MaybeError read_int(const json& body, const std::string& key, std::optional<int64_t>& out) {
  const json* v = field(body, key);
  if (!v) return {};
  if (v->is_number_unsigned()) {
    const auto u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return bad_request("'" + key + "' is too large: " + std::to_string(u), key);
    }
    out = static_cast<int64_t>(u);
    return {};
  }
  if (!v->is_number_integer()) return wrong_type(key, "an integer", *v);
  out = v->get<int64_t>();
  return {};
}

MaybeError read_int_in(const json& body, const std::string& key, int64_t lo, int64_t hi, std::optional<int64_t>& out) {
  PAGODA_RETURN_IF_API_ERROR(read_int(body, key, out));
  if (out && (*out < lo || *out > hi)) {
    return bad_request(
        key + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + std::to_string(*out), key);
  }
  return {};
}

MaybeError read_number(const json& body, const std::string& key, double& out) {
  const json* v = field(body, key);
  if (!v) return {};
  if (!v->is_number()) return wrong_type(key, "a number", *v);
  out = v->get<double>();
  if (!std::isfinite(out)) return bad_request("'" + key + "' must be a finite number", key);
  return {};
}

MaybeError read_string(const json& body, const std::string& key, std::optional<std::string>& out) {
  const json* v = field(body, key);
  if (!v) return {};
  if (!v->is_string()) return wrong_type(key, "a string", *v);
  out = v->get<std::string>();
  return {};
}

// True when `id`, a JSON integer, is a token id of a vocabulary of `vocab` tokens.
bool in_vocab(const json& id, int64_t vocab) {
  if (id.is_number_unsigned()) return id.get<uint64_t>() < static_cast<uint64_t>(vocab);
  return id.get<int64_t>() >= 0 && id.get<int64_t>() < vocab;
}

// ---- the body -------------------------------------------------------------------------------

// Which top-level field of `body` a JSON syntax error is in, so that a bad number (1e400) names
// it: a SAX pass that builds nothing (nlohmann's DOM callback parser rescans an object's members at
// each member's end, which a body of many small objects makes quadratic).
class FailingField : public nlohmann::json_sax<json> {
 public:
  std::string field;  // "" when the error is outside any field

  bool null() override { return value(); }
  bool boolean(bool) override { return value(); }
  bool number_integer(number_integer_t) override { return value(); }
  bool number_unsigned(number_unsigned_t) override { return value(); }
  bool number_float(number_float_t, const string_t&) override { return value(); }
  bool string(string_t&) override { return value(); }
  bool binary(binary_t&) override { return value(); }
  bool start_object(std::size_t) override { return ++depth_, true; }
  bool key(string_t& k) override {
    if (depth_ == 1) field = k;
    return true;
  }
  bool end_object() override { return --depth_, value(); }
  bool start_array(std::size_t) override { return ++depth_, true; }
  bool end_array() override { return --depth_, value(); }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override { return false; }

 private:
  bool value() {
    if (depth_ == 1) field.clear();  // a top-level field's value is complete
    return true;
  }
  int depth_ = 0;
};

ApiResult<json> parse_body(std::string_view body, const ProtocolLimits& limits) {
  if (!json_nesting_within(body, limits.max_json_depth)) {
    return bad_request("the request body nests arrays and objects deeper than " +
                       std::to_string(limits.max_json_depth) + " levels");
  }
  json j;
  try {
    j = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    FailingField where;
    json::sax_parse(body.begin(), body.end(), &where);
    if (where.field.size() > kMaxEchoedBytes) where.field.clear();
    return bad_request("the request body is not valid JSON: " + describe(e), where.field);
  }
  if (!j.is_object()) return bad_request("request body must be a JSON object");
  return j;
}

// ---- fields shared by both endpoints ------------------------------------------------------------

MaybeError read_model(const json& body, const ModelContext& model, std::string& out) {
  PAGODA_CHECK(!model.served_model_names.empty());
  std::optional<std::string> name;
  PAGODA_RETURN_IF_API_ERROR(read_string(body, "model", name));
  if (!name) {
    out = model.served_model_names.front();
    return {};
  }
  if (name->size() > kMaxModelNameBytes) {
    return bad_request("model name is longer than " + std::to_string(kMaxModelNameBytes) + " bytes", "model");
  }
  const auto& names = model.served_model_names;
  if (std::find(names.begin(), names.end(), *name) == names.end()) {
    ApiError e;
    e.status = 404;
    e.message = "The model `" + *name + "` does not exist.";
    e.type = "not_found_error";
    e.param = "model";
    e.code = "model_not_found";
    return e;
  }
  out = *name;
  return {};
}

MaybeError read_stop(const json& body, SamplingParams& p) {
  const json* v = field(body, "stop");
  if (!v) return {};
  std::vector<const json*> items;
  if (v->is_string()) {
    items.push_back(v);
  } else if (v->is_array()) {
    if (v->size() > SamplingParams::kMaxStop) {
      return bad_request("stop may hold at most " + std::to_string(SamplingParams::kMaxStop) + " strings, got " +
                             std::to_string(v->size()),
                         "stop");
    }
    for (const json& s : *v) items.push_back(&s);
  } else {
    return wrong_type("stop", "a string or an array of strings", *v);
  }
  for (const json* s : items) {
    if (!s->is_string()) return wrong_type("stop", "a string or an array of strings", *s);
    const auto& text = s->get_ref<const std::string&>();
    if (text.empty()) return bad_request("stop strings must not be empty", "stop");
    if (text.size() > kMaxStopStringBytes) {
      return bad_request("stop strings may be at most " + std::to_string(kMaxStopStringBytes) + " bytes long", "stop");
    }
    p.stop.push_back(text);
  }
  return {};
}

MaybeError read_stop_token_ids(const json& body, int64_t vocab, SamplingParams& p) {
  const json* v = field(body, "stop_token_ids");
  if (!v) return {};
  if (!v->is_array()) return wrong_type("stop_token_ids", "an array of token ids", *v);
  if (v->size() > kMaxStopTokenIds) {
    return bad_request("stop_token_ids may hold at most " + std::to_string(kMaxStopTokenIds) + " ids",
                       "stop_token_ids");
  }
  for (const json& id : *v) {
    if (!id.is_number_integer()) return wrong_type("stop_token_ids", "an array of token ids", id);
    if (!in_vocab(id, vocab)) {
      return bad_request(
          "stop_token_ids holds " + id.dump() + ", outside the vocabulary [0, " + std::to_string(vocab) + ")",
          "stop_token_ids");
    }
    p.stop_token_ids.push_back(static_cast<TokenId>(id.get<int64_t>()));
  }
  return {};
}

MaybeError read_logit_bias(const json& body, int64_t vocab, const ProtocolLimits& limits, SamplingParams& p) {
  const json* v = field(body, "logit_bias");
  if (!v) return {};
  if (!v->is_object()) return wrong_type("logit_bias", "an object of token id -> bias", *v);
  if (v->size() > limits.max_logit_bias) {
    return bad_request("logit_bias may hold at most " + std::to_string(limits.max_logit_bias) + " entries",
                       "logit_bias");
  }
  for (const auto& [key, value] : v->items()) {
    // Decimal digits only: no sign, no spaces, no "1e3"; at most 10 digits cannot overflow.
    const bool digits = !key.empty() && key.size() <= 10 &&
                        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    const int64_t id = digits ? std::stoll(key) : -1;
    if (!digits || id >= vocab) {
      return bad_request(
          "logit_bias key " + quote(key) + " is not a token id in the vocabulary [0, " + std::to_string(vocab) + ")",
          "logit_bias");
    }
    if (!value.is_number()) return wrong_type("logit_bias", "an object of token id -> number", value);
    const double bias = value.get<double>();
    if (!(bias >= -SamplingParams::kMaxAbsLogitBias && bias <= SamplingParams::kMaxAbsLogitBias)) {
      return bad_request("logit_bias values must be in [-100, 100], got " + fmt(bias) + " for token " + key,
                         "logit_bias");
    }
    p.logit_bias.emplace_back(static_cast<TokenId>(id), static_cast<float>(bias));
  }
  return {};
}

// Any JSON integer in the int64 or uint64 range; negative seeds wrap to uint64 (two's
// complement), so -1 and 18446744073709551615 are the same seed.
MaybeError read_seed(const json& body, SamplingParams& p) {
  const json* v = field(body, "seed");
  if (!v) return {};
  if (v->is_number_unsigned()) {
    p.seed = v->get<uint64_t>();
  } else if (v->is_number_integer()) {
    p.seed = static_cast<uint64_t>(v->get<int64_t>());
  } else {
    return wrong_type("seed", "an integer", *v);
  }
  return {};
}

// The token ids a request may hold: below the model's vocabulary and the tokenizer's.
int64_t token_limit(const ModelContext& model) {
  if (model.tokenizer == nullptr) return model.vocab_size;  // sampling_fields_problem: no model yet
  const int64_t tokenizer = model.tokenizer->vocab_size();
  return model.vocab_size > 0 ? std::min(model.vocab_size, tokenizer) : tokenizer;
}

// The sampling and streaming fields that completions and chat share.
MaybeError read_common(const json& body, const ModelContext& model, ParsedRequest& r, SamplingParams& p,
                       GenerateRequest& proto) {
  const int64_t vocab = token_limit(model);
  PAGODA_RETURN_IF_API_ERROR(read_number(body, "temperature", p.temperature));
  if (p.temperature < 0 || p.temperature > kMaxTemperature) {
    return bad_request("temperature must be in [0, 2], got " + fmt(p.temperature), "temperature");
  }
  PAGODA_RETURN_IF_API_ERROR(read_number(body, "top_p", p.top_p));
  std::optional<int64_t> top_k;
  PAGODA_RETURN_IF_API_ERROR(read_int_in(body, "top_k", -1, vocab, top_k));
  if (top_k) p.top_k = *top_k;
  PAGODA_RETURN_IF_API_ERROR(read_number(body, "min_p", p.min_p));
  PAGODA_RETURN_IF_API_ERROR(read_number(body, "presence_penalty", p.presence_penalty));
  PAGODA_RETURN_IF_API_ERROR(read_number(body, "frequency_penalty", p.frequency_penalty));
  PAGODA_RETURN_IF_API_ERROR(read_number(body, "repetition_penalty", p.repetition_penalty));
  PAGODA_RETURN_IF_API_ERROR(read_logit_bias(body, vocab, model.limits, p));
  PAGODA_RETURN_IF_API_ERROR(read_seed(body, p));
  PAGODA_RETURN_IF_API_ERROR(read_stop(body, p));
  PAGODA_RETURN_IF_API_ERROR(read_stop_token_ids(body, vocab, p));
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "ignore_eos", p.ignore_eos));
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "include_stop_str_in_output", p.include_stop_str_in_output));
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "skip_special_tokens", p.skip_special_tokens));
  std::optional<int64_t> min_tokens;
  PAGODA_RETURN_IF_API_ERROR(read_int_in(body, "min_tokens", 0, std::numeric_limits<int64_t>::max(), min_tokens));
  if (min_tokens) p.min_tokens = *min_tokens;
  std::optional<int64_t> n;
  PAGODA_RETURN_IF_API_ERROR(read_int_in(body, "n", 1, model.limits.max_n, n));
  if (n) p.n = *n;
  r.n = p.n;
  std::optional<int64_t> best_of;
  PAGODA_RETURN_IF_API_ERROR(read_int(body, "best_of", best_of));
  if (best_of && *best_of != p.n) {
    return bad_request("best_of is not supported (it may only equal n)", "best_of");
  }
  std::optional<int64_t> priority;
  PAGODA_RETURN_IF_API_ERROR(read_int(body, "priority", priority));
  if (priority && *priority != 0 && !model.priority_scheduling) {
    // vLLM's answer: a priority the scheduler would not honour is refused, not ignored.
    return bad_request("priority " + std::to_string(*priority) +
                           " was given, but priority scheduling is not enabled (--scheduling-policy priority)",
                       "priority");
  }
  if (priority) proto.priority = *priority;
  if (const json* kv = field(body, "kv_transfer_params"); kv != nullptr && !kv->is_null()) {
    if (!kv->is_object()) return wrong_type("kv_transfer_params", "an object", *kv);
    Result<KvTransferParams> params = KvTransferParams::from_json(kv->dump());
    if (!params.ok()) return bad_request(params.status().message(), "kv_transfer_params");
    if (params->do_remote_decode && params->do_remote_prefill) {
      return bad_request("kv_transfer_params: do_remote_decode and do_remote_prefill together", "kv_transfer_params");
    }
    if (params->do_remote_decode || params->do_remote_prefill) proto.kv_transfer = *params;
  }
  std::optional<std::string> salt;
  PAGODA_RETURN_IF_API_ERROR(read_string(body, "cache_salt", salt));
  if (salt) {
    if (salt->empty()) return bad_request("cache_salt must not be empty", "cache_salt");
    proto.cache_salt = *salt;
  }
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "stream", r.stream));
  if (const json* options = field(body, "stream_options")) {
    if (!options->is_object()) return wrong_type("stream_options", "an object", *options);
    if (!r.stream) return bad_request("stream_options may only be set when stream is true", "stream_options");
    if (const json* usage = field(*options, "include_usage")) {
      if (!usage->is_boolean()) return wrong_type("stream_options", "include_usage to be a boolean", *usage);
      r.include_usage = usage->get<bool>();
    }
  }
  std::optional<int64_t> prompt_logprobs;
  PAGODA_RETURN_IF_API_ERROR(read_int_in(body, "prompt_logprobs", 0, model.limits.max_logprobs, prompt_logprobs));
  if (prompt_logprobs) {
    if (r.stream) return bad_request("prompt_logprobs is not available when stream is true", "prompt_logprobs");
    r.prompt_logprobs = prompt_logprobs;
    p.prompt_logprobs = prompt_logprobs;
  }
  return {};
}

// The engine's one validator (request_validation.h), with the field names this endpoint uses: the
// request as the engine takes it, checked once.
ApiResult<PreparedRequest> prepare(GenerateRequest g, const ModelContext& model, const std::string& max_tokens_key,
                                   Endpoint endpoint) {
  RequestFieldNames names;
  names.max_tokens = max_tokens_key;
  if (endpoint == Endpoint::kChat) {
    names.prompt = "messages";
    names.logprobs = "top_logprobs";
  }
  const RequestLimits limits{token_limit(model), model.max_model_len, model.limits.max_logprobs};
  std::variant<PreparedRequest, RequestError> prepared = prepare_request(std::move(g), limits, names);
  if (auto* bad = std::get_if<RequestError>(&prepared)) {
    return bad_request(std::move(bad->message), std::move(bad->param), std::move(bad->code));
  }
  return std::move(std::get<PreparedRequest>(prepared));
}

// generation_config.json's max_new_tokens bounds every request's max_tokens, as in vLLM.
int64_t capped_max_tokens(int64_t max_tokens, const ModelContext& model) {
  const auto& cap = model.defaults.max_new_tokens;
  return cap ? std::min(max_tokens, *cap) : max_tokens;
}

// ---- fields: known, refused, ignored --------------------------------------------------------------

// Fields that would change the result and that this server does not implement: a 400 naming the
// field, never a silent answer to a different question. `harmless` says which values ask for
// nothing (absent and null always do).
struct Refused {
  const char* key;
  bool (*harmless)(const json&);
  const char* what;
};

bool never(const json&) { return false; }
bool is_false(const json& v) { return v.is_boolean() && !v.get<bool>(); }
bool is_true(const json& v) { return v.is_boolean() && v.get<bool>(); }
bool is_empty(const json& v) {
  return (v.is_array() || v.is_object() || v.is_string()) && v.empty();
}

constexpr Refused kRefused[] = {
    {"functions", is_empty, "functions (function calling)"},
    {"use_beam_search", is_false, "use_beam_search (beam search)"},
    {"allowed_token_ids", never, "allowed_token_ids"},
    {"bad_words", is_empty, "bad_words"},
    {"logits_processors", is_empty, "logits_processors"},
    {"truncate_prompt_tokens", never, "truncate_prompt_tokens"},
    {"continue_final_message", is_false, "continue_final_message"},
    {"spaces_between_special_tokens", is_true, "spaces_between_special_tokens false"},
    {"return_tokens_as_token_ids", is_false, "return_tokens_as_token_ids"},
    {"chat_template", never, "a per-request chat_template"},
    {"documents", is_empty, "documents"},
};

MaybeError refuse_unsupported(const json& body) {
  for (const Refused& r : kRefused) {
    const json* v = field(body, r.key);
    if (v && !r.harmless(*v)) return bad_request(std::string(r.what) + " is not supported by this server", r.key);
  }
  return {};
}

// Every field a request may carry; the rest are ignored, and reported in ignored_fields. Some
// have no effect here by nature: user (OpenAI's end-user id), parallel_tool_calls (without
// tools), request_id (we make our own). The structured-output fields are structured_fields.h's.
const char* const kCommonFields[] = {
    "model", "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "logit_bias", "seed", "stop", "stop_token_ids", "ignore_eos",
    "include_stop_str_in_output", "skip_special_tokens", "min_tokens", "n", "best_of", "priority",
    "cache_salt", "stream", "stream_options", "max_tokens", "prompt_logprobs", "user",
    "request_id", "parallel_tool_calls", "kv_transfer_params"};
const char* const kCompletionFields[] = {"prompt", "logprobs", "echo", "suffix", "add_special_tokens"};
const char* const kChatFields[] = {"messages", "max_completion_tokens", "logprobs", "top_logprobs",
                                   "add_generation_prompt", "chat_template_kwargs", "add_special_tokens", "tools",
                                   "tool_choice"};

std::vector<std::string> unknown_fields(const json& body, Endpoint endpoint) {
  std::vector<std::string> out;
  for (const auto& item : body.items()) {
    const std::string& key = item.key();  // a named variable: clang 14 cannot capture a binding
    const auto is = [&key](const auto& list) {
      return std::any_of(std::begin(list), std::end(list), [&key](const char* k) { return key == k; });
    };
    const bool refused = std::any_of(std::begin(kRefused), std::end(kRefused),
                                     [&key](const Refused& r) { return key == r.key; });
    const bool own = endpoint == Endpoint::kChat ? is(kChatFields) : is(kCompletionFields);
    if (refused || own || is(kCommonFields) || is_constraint_field(key)) continue;
    out.push_back(key.size() > kMaxEchoedBytes ? key.substr(0, kMaxEchoedBytes) + "..." : key);
  }
  return out;
}

// ---- completions prompts ---------------------------------------------------------------------------

MaybeError read_token_ids(const json& list, int64_t vocab, std::vector<TokenId>& out) {
  out.reserve(list.size());
  for (const json& id : list) {
    if (!id.is_number_integer()) {
      return bad_request(
          "a prompt must be a string, an array of strings, an array of token ids, or an array "
          "of arrays of token ids",
          "prompt");
    }
    if (!in_vocab(id, vocab)) {
      return bad_request(
          "prompt token id " + id.dump() + " is outside the vocabulary [0, " + std::to_string(vocab) + ")", "prompt");
    }
    out.push_back(static_cast<TokenId>(id.get<int64_t>()));
  }
  if (out.empty()) return bad_request("prompt must not be empty", "prompt");
  return {};
}

struct PromptInput {
  std::string text;          // a text prompt, or the decoded ids (for echo)
  std::vector<TokenId> ids;  // filled for id prompts; text prompts are tokenized later
  bool is_text = false;
};

MaybeError read_prompts(const json& body, const ModelContext& model, std::vector<PromptInput>& out) {
  const json* v = field(body, "prompt");
  if (!v) return bad_request("prompt is required", "prompt");
  const int64_t vocab = token_limit(model);
  const auto add_text = [&](const std::string& text) -> MaybeError {
    out.push_back({text, {}, true});
    return {};
  };
  if (v->is_string()) return add_text(v->get_ref<const std::string&>());
  if (!v->is_array()) return wrong_type("prompt", "a string or an array", *v);
  if (v->empty()) return bad_request("prompt must not be empty", "prompt");
  const json& first = v->front();
  if (first.is_number_integer()) {  // one prompt of token ids
    PromptInput p;
    PAGODA_RETURN_IF_API_ERROR(read_token_ids(*v, vocab, p.ids));
    out.push_back(std::move(p));
    return {};
  }
  if (v->size() > model.limits.max_prompts) {
    return bad_request("prompt may hold at most " + std::to_string(model.limits.max_prompts) + " prompts, got " +
                           std::to_string(v->size()),
                       "prompt");
  }
  // A batch: all strings, or all arrays of ids (OpenAI does not mix them).
  const bool strings = first.is_string();
  for (const json& item : *v) {
    if (strings && item.is_string()) {
      PAGODA_RETURN_IF_API_ERROR(add_text(item.get_ref<const std::string&>()));
    } else if (!strings && item.is_array()) {
      PromptInput p;
      PAGODA_RETURN_IF_API_ERROR(read_token_ids(item, vocab, p.ids));
      out.push_back(std::move(p));
    } else {
      return bad_request(
          "a prompt must be a string, an array of strings, an array of token ids, or an array "
          "of arrays of token ids (not mixed)",
          "prompt");
    }
  }
  return {};
}

// ---- chat messages ------------------------------------------------------------------------------

MaybeError read_messages(const json& body, const ModelContext& model, std::vector<ChatMessage>& out) {
  const json* v = field(body, "messages");
  if (!v) return bad_request("messages is required", "messages");
  if (!v->is_array()) return wrong_type("messages", "an array", *v);
  if (v->empty()) return bad_request("messages must not be empty", "messages");
  if (v->size() > model.limits.max_messages) {
    return bad_request("messages may hold at most " + std::to_string(model.limits.max_messages) + " messages, got " +
                           std::to_string(v->size()),
                       "messages");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& m = (*v)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    const auto fail = [&](const std::string& what) { return bad_request(where + " " + what, "messages"); };
    if (!m.is_object()) return fail(std::string("must be an object, got ") + type_name(m));
    const json* role = field(m, "role");
    if (!role || !role->is_string()) return fail("needs a role (a string)");
    const std::string& r = role->get_ref<const std::string&>();
    static const char* const kRoles[] = {"system", "developer", "user", "assistant", "tool"};
    if (std::find(std::begin(kRoles), std::end(kRoles), r) == std::end(kRoles)) {
      return fail("has role " + quote(r) + "; it must be one of system, developer, user, assistant, tool");
    }
    ChatMessage msg;
    // Templates know "system"; OpenAI's "developer" messages play that part.
    msg.role = r == "developer" ? "system" : r;
    const json* content = field(m, "content");
    if (!content) {
      if (r != "assistant") return fail("needs content");
    } else if (content->is_string()) {
      msg.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Text parts joined by newlines, as vLLM does.
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const json* type = part.is_object() ? field(part, "type") : nullptr;
        if (!type || !type->is_string()) return fail("content parts must be objects with a type");
        if (type->get_ref<const std::string&>() != "text") {
          return fail("has a content part of type " + quote(type->get_ref<const std::string&>()) +
                      "; only \"text\" is supported");
        }
        const json* text = field(part, "text");
        if (!text || !text->is_string()) return fail("has a text part without a text string");
        if (k > 0) msg.content += '\n';
        msg.content += text->get_ref<const std::string&>();
      }
    } else {
      return fail(std::string("content must be a string or an array of text parts, got ") + type_name(*content));
    }
    if (r == "tool") {
      const json* call = field(m, "tool_call_id");
      if (!call || !call->is_string()) return fail("is a tool message without a tool_call_id string");
      msg.tool_call_id = call->get<std::string>();
    }
    if (const json* calls = field(m, "tool_calls"); calls && r == "assistant") {
      if (!calls->is_array()) return fail("tool_calls must be an array");
      for (size_t k = 0; k < calls->size(); ++k) {
        const json& c = (*calls)[k];
        const json* f = c.is_object() ? field(c, "function") : nullptr;
        const json* name = f && f->is_object() ? field(*f, "name") : nullptr;
        const json* args = f && f->is_object() ? field(*f, "arguments") : nullptr;
        const json* id = c.is_object() ? field(c, "id") : nullptr;
        if (!name || !name->is_string()) return fail("tool_calls[" + std::to_string(k) + "] needs function.name");
        // OpenAI sends the arguments as JSON text (the template sees them parsed; text that is not
        // JSON, a call cut short, as a string); an object is taken too; "" is no arguments.
        std::string arguments = "{}";
        if (args && args->is_string() && !args->get_ref<const std::string&>().empty()) {
          arguments = args->get<std::string>();
          if (!json_nesting_within(arguments, model.limits.max_json_depth)) {
            return fail("tool_calls[" + std::to_string(k) + "].function.arguments nests deeper than " +
                        std::to_string(model.limits.max_json_depth) + " levels");
          }
        } else if (args && args->is_object()) {
          arguments = args->dump();
        } else if (args && !args->is_string()) {
          return fail("tool_calls[" + std::to_string(k) + "].function.arguments must be a JSON string");
        }
        msg.tool_calls.push_back({id && id->is_string() ? id->get<std::string>() : std::string(), name->get<std::string>(),
                                  std::move(arguments)});
      }
    }
    if (r == "assistant") {
      for (const char* key : {"reasoning_content", "reasoning"}) {
        const json* reasoning = field(m, key);
        if (!reasoning) continue;
        if (!reasoning->is_string()) return fail(std::string(key) + " must be a string");
        if (msg.reasoning_content.empty()) msg.reasoning_content = reasoning->get<std::string>();
      }
    }
    out.push_back(std::move(msg));
  }
  return {};
}

// Template options from the request: add_generation_prompt and chat_template_kwargs (of which
// only enable_thinking is read; a template must not see the request's other keys).
MaybeError read_template_options(const json& body, const ModelContext& model, ChatTemplateOptions& options) {
  options.bos_token = model.bos_token;
  options.eos_token = model.eos_token;
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "add_generation_prompt", options.add_generation_prompt));
  if (const json* kwargs = field(body, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return wrong_type("chat_template_kwargs", "an object", *kwargs);
    if (const json* thinking = field(*kwargs, "enable_thinking")) {
      if (!thinking->is_boolean()) {
        return bad_request("chat_template_kwargs.enable_thinking must be a boolean", "chat_template_kwargs");
      }
      options.flags["enable_thinking"] = thinking->get<bool>();
    }
  }
  return {};
}

// The chat prompt of `body`, with the tools' JSON text for the template ("" for none).
MaybeError render_chat(const json& body, const ModelContext& model, const std::string& tools_json, ChatPrompt& prompt) {
  std::vector<ChatMessage> messages;
  PAGODA_RETURN_IF_API_ERROR(read_messages(body, model, messages));
  ChatTemplateOptions options;
  PAGODA_RETURN_IF_API_ERROR(read_template_options(body, model, options));
  options.tools_json = tools_json;
  if (!model.chat_template) {
    return bad_request(
        "this model has no chat template, so the server cannot format messages; start it with "
        "--chat-template FILE");
  }
  Result<ChatPrompt> encoded = encode_chat(*model.chat_template, *model.tokenizer, messages, options);
  if (!encoded.ok()) return bad_request(encoded.status().message(), "messages");
  prompt = std::move(encoded).value();
  return {};
}

// Runs a parser, turning any exception that slipped past the checks into an error response.
template <typename F>
auto guarded(F&& parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (const json::exception& e) {
    return bad_request("invalid request: " + describe(e));
  } catch (const std::bad_alloc&) {
    ApiError e;
    e.status = 500;
    e.message = "out of memory while reading the request";
    e.type = "server_error";
    return e;
  }
}

// What both generation endpoints read first: the body, the model, and the fields they share.
struct CommonFields {
  json body;
  ParsedRequest r;
  SamplingParams p;
  GenerateRequest proto;
};

ApiResult<CommonFields> read_request(std::string_view body_text, const ModelContext& model, Endpoint endpoint) {
  PAGODA_CHECK(model.tokenizer != nullptr && model.max_model_len > 0);
  ApiResult<json> parsed = parse_body(body_text, model.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  CommonFields c;
  c.body = std::move(std::get<json>(parsed));
  c.r.endpoint = endpoint;
  PAGODA_RETURN_IF_API_ERROR(read_model(c.body, model, c.r.model));
  PAGODA_RETURN_IF_API_ERROR(refuse_unsupported(c.body));
  c.r.ignored_fields = unknown_fields(c.body, endpoint);
  model.defaults.apply_to(c.p);
  PAGODA_RETURN_IF_API_ERROR(read_common(c.body, model, c.r, c.p, c.proto));
  return c;
}

ApiResult<ParsedRequest> parse_completion(std::string_view body_text, const ModelContext& model) {
  ApiResult<CommonFields> begun = read_request(body_text, model, Endpoint::kCompletions);
  if (auto* e = std::get_if<ApiError>(&begun)) return *e;
  auto& [body, r, p, proto] = std::get<CommonFields>(begun);
  std::optional<int64_t> max_tokens;
  PAGODA_RETURN_IF_API_ERROR(read_int(body, "max_tokens", max_tokens));
  if (max_tokens) {
    if (*max_tokens < 1)
      return bad_request("max_tokens must be >= 1, got " + std::to_string(*max_tokens), "max_tokens");
  }
  p.max_tokens = capped_max_tokens(max_tokens.value_or(model.default_max_tokens), model);
  std::optional<int64_t> logprobs;
  PAGODA_RETURN_IF_API_ERROR(read_int_in(body, "logprobs", 0, model.limits.max_logprobs, logprobs));
  r.logprobs = logprobs;
  p.logprobs = logprobs;
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "echo", r.echo));
  // The prompt's own logprobs come first in an echoed choice.
  if (r.echo && logprobs) p.prompt_logprobs = std::max(*logprobs, p.prompt_logprobs.value_or(0));
  std::optional<std::string> suffix;
  PAGODA_RETURN_IF_API_ERROR(read_string(body, "suffix", suffix));
  if (suffix && !suffix->empty()) return bad_request("suffix is not supported by this server", "suffix");
  bool add_special_tokens = true;
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "add_special_tokens", add_special_tokens));
  ApiResult<std::optional<GrammarConstraint>> constraint = read_constraint(body, body_text, model.structured, std::nullopt);
  if (auto* e = std::get_if<ApiError>(&constraint)) return *e;
  proto.constraint = std::move(std::get<std::optional<GrammarConstraint>>(constraint));
  std::vector<PromptInput> prompts;
  PAGODA_RETURN_IF_API_ERROR(read_prompts(body, model, prompts));
  if (static_cast<int64_t>(prompts.size()) * p.n > model.limits.max_sequences) {
    return bad_request("prompts x n must be at most " + std::to_string(model.limits.max_sequences) + ", got " +
                           std::to_string(prompts.size()) + " x " + std::to_string(p.n),
                       "n");
  }
  for (PromptInput& in : prompts) {
    GenerateRequest g = proto;
    g.params = p;
    g.add_special_tokens = add_special_tokens;
    if (in.is_text) {
      g.prompt_token_ids = model.tokenizer->encode(in.text, add_special_tokens);
    } else {
      g.prompt_token_ids = std::move(in.ids);
      in.text = model.tokenizer->decode(g.prompt_token_ids, /*skip_special=*/false);
    }
    g.prompt = in.text;
    ApiResult<PreparedRequest> prepared = prepare(std::move(g), model, "max_tokens", Endpoint::kCompletions);
    if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
    r.prompt_texts.push_back(std::move(in.text));
    r.prompts.push_back(std::move(std::get<PreparedRequest>(prepared)));
  }
  return std::move(r);
}

ApiResult<ParsedRequest> parse_chat(std::string_view body_text, const ModelContext& model) {
  ApiResult<CommonFields> begun = read_request(body_text, model, Endpoint::kChat);
  if (auto* e = std::get_if<ApiError>(&begun)) return *e;
  auto& [body, r, p, proto] = std::get<CommonFields>(begun);
  // max_completion_tokens replaced max_tokens; vLLM prefers it when both are given.
  std::string max_tokens_key = "max_tokens";
  std::optional<int64_t> max_tokens;
  PAGODA_RETURN_IF_API_ERROR(read_int(body, "max_tokens", max_tokens));
  std::optional<int64_t> max_completion_tokens;
  PAGODA_RETURN_IF_API_ERROR(read_int(body, "max_completion_tokens", max_completion_tokens));
  if (max_completion_tokens) {
    max_tokens = max_completion_tokens;
    max_tokens_key = "max_completion_tokens";
  }
  if (max_tokens && *max_tokens < 1) {
    return bad_request(max_tokens_key + " must be >= 1, got " + std::to_string(*max_tokens), max_tokens_key);
  }
  bool logprobs = false;
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "logprobs", logprobs));
  std::optional<int64_t> top_logprobs;
  PAGODA_RETURN_IF_API_ERROR(read_int_in(body, "top_logprobs", 0, model.limits.max_logprobs, top_logprobs));
  if (top_logprobs && !logprobs) {
    return bad_request("top_logprobs may only be set when logprobs is true", "top_logprobs");
  }
  if (logprobs) {
    r.logprobs = top_logprobs.value_or(0);
    p.logprobs = r.logprobs;
  }

  // Thinking first (--reasoning-parser, unless the request switched it off): a constraint then
  // starts after the end of thinking.
  ChatTemplateOptions peek;
  PAGODA_RETURN_IF_API_ERROR(read_template_options(body, model, peek));
  const auto thinking_flag = peek.flags.find("enable_thinking");
  const bool thinking = model.reasoning && (thinking_flag == peek.flags.end() || thinking_flag->second);
  const std::optional<TokenId> after = thinking ? model.reasoning_end_token : std::nullopt;
  r.reasoning = thinking ? model.reasoning : nullptr;
  // The end of thinking must reach the parser as text (a control token would be skipped).
  if (after && model.tokenizer->is_special(*after)) p.skip_special_tokens = false;
  ApiResult<ToolRequest> tools = read_tools(body, body_text, model.tools, model.structured, after);
  if (auto* e = std::get_if<ApiError>(&tools)) return *e;
  r.tools = std::move(std::get<ToolRequest>(tools));
  ApiResult<std::optional<GrammarConstraint>> constraint = read_constraint(body, body_text, model.structured, after);
  if (auto* e = std::get_if<ApiError>(&constraint)) return *e;
  proto.constraint = std::move(std::get<std::optional<GrammarConstraint>>(constraint));
  if (r.tools.constraint) {
    if (proto.constraint) {
      return bad_request("tool_choice " + std::string(r.tools.choice == ToolRequest::Choice::kNamed ? "naming a function"
                                                                                                      : "\"required\"") +
                             " constrains the output already; it cannot be combined with a structured output",
                         "tool_choice");
    }
    proto.constraint = r.tools.constraint;
  }
  if (thinking && !after && proto.constraint) {
    return bad_request("a structured output with --reasoning-parser needs the end of thinking to be one token of the "
                       "vocabulary",
                       "response_format");
  }
  if (r.tools.choice == ToolRequest::Choice::kAuto) {
    r.tool_parser = model.tools.parser;
    // A tool parser that reads control tokens' text (mistral's [TOOL_CALLS]) needs it in the output.
    if (r.tool_parser->needs_special_tokens()) p.skip_special_tokens = false;
  }
  ChatPrompt prompt;
  PAGODA_RETURN_IF_API_ERROR(render_chat(body, model, r.tools.tools_json, prompt));
  const auto num_prompt = static_cast<int64_t>(prompt.ids.size());
  // Without max_tokens the answer may use whatever the prompt leaves of the context.
  p.max_tokens = capped_max_tokens(max_tokens ? *max_tokens : std::max<int64_t>(model.max_model_len - num_prompt, 1),
                                   model);

  GenerateRequest g = proto;
  g.params = p;
  g.add_special_tokens = false;
  g.prompt = prompt.text;
  g.prompt_token_ids = std::move(prompt.ids);
  ApiResult<PreparedRequest> prepared = prepare(std::move(g), model, max_tokens_key, Endpoint::kChat);
  if (auto* e = std::get_if<ApiError>(&prepared)) return *e;
  r.prompt_texts.push_back(std::move(prompt.text));
  r.prompts.push_back(std::move(std::get<PreparedRequest>(prepared)));
  return std::move(r);
}

// ---- /tokenize, /detokenize ---------------------------------------------------------------------

// What /tokenize and /detokenize read first: the body, and its model (checked, not kept).
ApiResult<json> read_tokenizer_body(std::string_view body_text, const ModelContext& model) {
  PAGODA_CHECK(model.tokenizer != nullptr);
  ApiResult<json> parsed = parse_body(body_text, model.limits);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  std::string name;
  PAGODA_RETURN_IF_API_ERROR(read_model(std::get<json>(parsed), model, name));
  return parsed;
}

ApiResult<std::string> tokenize(std::string_view body_text, const ModelContext& model) {
  ApiResult<json> parsed = read_tokenizer_body(body_text, model);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& body = std::get<json>(parsed);
  bool return_token_strs = false;
  PAGODA_RETURN_IF_API_ERROR(read_bool(body, "return_token_strs", return_token_strs));
  std::vector<TokenId> ids;
  if (field(body, "messages")) {
    // Rendered as a chat request is, tools included, and refused as one is (continue_final_message, ...).
    PAGODA_RETURN_IF_API_ERROR(refuse_unsupported(body));
    ApiResult<std::string> tools = read_tools_json(body, body_text);
    if (auto* e = std::get_if<ApiError>(&tools)) return *e;
    ChatPrompt prompt;
    PAGODA_RETURN_IF_API_ERROR(render_chat(body, model, std::get<std::string>(tools), prompt));
    ids = std::move(prompt.ids);
  } else {
    std::optional<std::string> prompt;
    PAGODA_RETURN_IF_API_ERROR(read_string(body, "prompt", prompt));
    if (!prompt) return bad_request("either prompt or messages is required", "prompt");
    bool add_special_tokens = true;
    PAGODA_RETURN_IF_API_ERROR(read_bool(body, "add_special_tokens", add_special_tokens));
    ids = model.tokenizer->encode(*prompt, add_special_tokens);
  }
  ojson out;
  out["count"] = ids.size();
  out["max_model_len"] = model.max_model_len;
  out["tokens"] = ids;
  if (return_token_strs) {
    ojson strs = ojson::array();
    for (TokenId id : ids) strs.push_back(token_string(*model.tokenizer, id));
    out["token_strs"] = std::move(strs);
  } else {
    out["token_strs"] = nullptr;
  }
  return dump(out);
}

ApiResult<std::string> detokenize(std::string_view body_text, const ModelContext& model) {
  ApiResult<json> parsed = read_tokenizer_body(body_text, model);
  if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
  const json& body = std::get<json>(parsed);
  const json* tokens = field(body, "tokens");
  if (!tokens) return bad_request("tokens is required", "tokens");
  if (!tokens->is_array()) return wrong_type("tokens", "an array of token ids", *tokens);
  const int64_t vocab = token_limit(model);
  std::vector<TokenId> ids;
  ids.reserve(tokens->size());
  for (const json& id : *tokens) {
    if (!id.is_number_integer()) return wrong_type("tokens", "an array of token ids", id);
    if (!in_vocab(id, vocab)) {
      return bad_request("token id " + id.dump() + " is outside the vocabulary [0, " + std::to_string(vocab) + ")",
                         "tokens");
    }
    ids.push_back(static_cast<TokenId>(id.get<int64_t>()));
  }
  ojson out;
  out["prompt"] = model.tokenizer->decode(ids, /*skip_special=*/false);
  return dump(out);
}

}  // namespace

std::vector<std::string> IgnoredFieldNames::first_seen(const std::vector<std::string>& names) {
  std::vector<std::string> out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& name : names) {
    if (seen_.count(name) || seen_.size() >= kMaxNames) continue;
    seen_.insert(name);
    out.push_back(name);
  }
  return out;
}

namespace {

// A request with kv_transfer_params, checked against this instance's role. A prefill request
// computes its prompt and one token (with min_tokens at most 1, so that the first token is the
// one a single instance would sample) and answers with where its KV is kept.
ApiResult<ParsedRequest> with_kv_transfer(ApiResult<ParsedRequest> parsed, const ModelContext& model) {
  auto* r = std::get_if<ParsedRequest>(&parsed);
  if (r == nullptr || r->prompts.empty() || !r->prompts[0].kv_transfer) return parsed;
  const char* param = "kv_transfer_params";
  if (r->prompts.size() != 1 || r->n != 1) {
    return bad_request("kv_transfer_params: a request with them has one prompt and n 1", param);
  }
  GenerateRequest& g = r->prompts[0];
  KvTransferParams& p = *g.kv_transfer;
  if (p.do_remote_prefill && !model.kv_transfer.consumer) {
    return bad_request("kv_transfer_params.do_remote_prefill: this instance is not a KV consumer (start it with "
                       "--kv-transfer-config kv_role kv_consumer or kv_both)", param);
  }
  if (!p.do_remote_decode) return parsed;
  if (!model.kv_transfer.producer) {
    return bad_request("kv_transfer_params.do_remote_decode: this instance is not a KV producer (start it with "
                       "--kv-transfer-config kv_role kv_producer or kv_both)", param);
  }
  if (r->stream) return bad_request("kv_transfer_params.do_remote_decode: a prefill request is not streamed", "stream");
  // Unpredictable ids (std::random_device reads the kernel's generator), and a decode instance
  // must name the very prompt too (remote_connector.h's prompt hash) to read what is kept.
  std::random_device entropy;
  p.transfer_id = ((static_cast<uint64_t>(entropy()) << 32) | entropy()) & 0x7fffffffffffffffULL;
  g.params.max_tokens = 1;
  g.params.min_tokens = std::min<int64_t>(g.params.min_tokens, 1);
  KvTransferParams answer;
  answer.do_remote_prefill = true;
  answer.remote_engine_id = model.kv_transfer.engine_id;
  answer.remote_host = model.kv_transfer.host;
  answer.remote_port = model.kv_transfer.port;
  answer.remote_request_id = p.transfer_id;
  answer.remote_num_tokens = static_cast<int64_t>(g.prompt_token_ids.size());
  answer.remote_tp_size = model.kv_transfer.tp_size;
  r->kv_answer = std::move(answer);
  return parsed;
}

}  // namespace

ApiResult<ParsedRequest> parse_completion_request(std::string_view body, const ModelContext& model) {
  return with_kv_transfer(guarded([&] { return parse_completion(body, model); }), model);
}

ApiResult<ParsedRequest> parse_chat_request(std::string_view body, const ModelContext& model) {
  return with_kv_transfer(guarded([&] { return parse_chat(body, model); }), model);
}

ApiResult<ChatPrompt> render_chat_messages(std::string_view body_text, const ModelContext& model) {
  return guarded([&]() -> ApiResult<ChatPrompt> {
    PAGODA_CHECK(model.tokenizer != nullptr);
    ApiResult<json> parsed = parse_body(body_text, model.limits);
    if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
    PAGODA_RETURN_IF_API_ERROR(refuse_unsupported(std::get<json>(parsed)));
    ApiResult<std::string> tools = read_tools_json(std::get<json>(parsed), body_text);
    if (auto* e = std::get_if<ApiError>(&tools)) return *e;
    ChatPrompt prompt;
    PAGODA_RETURN_IF_API_ERROR(render_chat(std::get<json>(parsed), model, std::get<std::string>(tools), prompt));
    return prompt;
  });
}

std::optional<std::string> sampling_fields_problem(std::string_view body_text) {
  ApiResult<bool> checked = guarded([&]() -> ApiResult<bool> {
    // No model: its vocabulary and --max-logprobs bound the ids and logprobs at generate().
    ModelContext model;
    model.vocab_size = std::numeric_limits<TokenId>::max();
    model.limits.max_logprobs = std::numeric_limits<int64_t>::max();
    ApiResult<json> parsed = parse_body(body_text, model.limits);
    if (auto* e = std::get_if<ApiError>(&parsed)) return *e;
    const json& body = std::get<json>(parsed);
    ParsedRequest r;
    SamplingParams p;
    GenerateRequest proto;
    PAGODA_RETURN_IF_API_ERROR(read_common(body, model, r, p, proto));
    std::optional<int64_t> max_tokens, logprobs;
    PAGODA_RETURN_IF_API_ERROR(read_int(body, "max_tokens", max_tokens));
    PAGODA_RETURN_IF_API_ERROR(read_int(body, "logprobs", logprobs));
    if (max_tokens) p.max_tokens = *max_tokens;
    p.logprobs = logprobs;
    if (auto bad = p.check(model.vocab_size, model.limits.max_logprobs)) return bad_request(bad->message, bad->param);
    return true;
  });
  if (const auto* e = std::get_if<ApiError>(&checked)) return e->message;
  return std::nullopt;
}

ApiResult<std::string> handle_tokenize(std::string_view body, const ModelContext& model) {
  return guarded([&] { return tokenize(body, model); });
}

ApiResult<std::string> handle_detokenize(std::string_view body, const ModelContext& model) {
  return guarded([&] { return detokenize(body, model); });
}

}  // namespace pagoda::server
