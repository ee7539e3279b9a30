// OpenAI protocol, responses: response objects and SSE chunks built from the engine's output.
#include "server/openai_response.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "base/check.h"

namespace pagoda::server {

namespace {

using ojson = nlohmann::ordered_json;  // responses keep OpenAI's field order

constexpr double kMinLogprob = -9999.0;  // what OpenAI and vLLM send for -inf

std::string sse(const ojson& j) { return "data: " + dump(j) + "\n\n"; }

double clamp_logprob(float lp) { return std::isfinite(lp) ? std::max<double>(lp, kMinLogprob) : kMinLogprob; }

ojson token_bytes_json(const Tokenizer& tok, TokenId id) {
  ojson bytes = ojson::array();
  for (char c : tok.token_bytes(id)) bytes.push_back(static_cast<int>(static_cast<uint8_t>(c)));
  return bytes;
}

ojson usage_json(int64_t prompt, int64_t completion, int64_t cached) {
  ojson u;
  u["prompt_tokens"] = prompt;
  u["completion_tokens"] = completion;
  u["total_tokens"] = prompt + completion;
  u["prompt_tokens_details"] = {{"cached_tokens", cached}};
  return u;
}

// Completions logprobs: four parallel lists. A token's text_offset counts the bytes of the
// token strings before it, from the start of the choice (vLLM's rule; the choice's text can
// differ from the concatenated token strings where decoding drops a space or a special token).
struct CompletionLogprobs {
  ojson tokens = ojson::array(), token_logprobs = ojson::array(), top_logprobs = ojson::array(),
        text_offset = ojson::array();

  // A token without a logprob: the first prompt token, which nothing precedes.
  void add_bare(const Tokenizer& tok, TokenId id, int64_t& offset) {
    const std::string s = token_string(tok, id);
    tokens.push_back(s);
    token_logprobs.push_back(nullptr);
    top_logprobs.push_back(nullptr);
    text_offset.push_back(offset);
    offset += static_cast<int64_t>(s.size());
  }

  // The top entries and, as OpenAI promises, the chosen token (so up to N + 1 entries).
  void add(const Tokenizer& tok, const SampledOutput& s, int64_t& offset) {
    const std::string text = token_string(tok, s.token);
    tokens.push_back(text);
    token_logprobs.push_back(clamp_logprob(s.logprob));
    ojson top = ojson::object();
    bool has_chosen = false;
    for (const TokenLogprobEntry& e : s.top_logprobs) {
      top[token_string(tok, e.token)] = clamp_logprob(e.logprob);
      has_chosen = has_chosen || e.token == s.token;
    }
    if (!has_chosen) top[text] = clamp_logprob(s.logprob);
    top_logprobs.push_back(std::move(top));
    text_offset.push_back(offset);
    offset += static_cast<int64_t>(text.size());
  }

  ojson to_json() && {
    ojson j;
    j["tokens"] = std::move(tokens);
    j["token_logprobs"] = std::move(token_logprobs);
    j["top_logprobs"] = std::move(top_logprobs);
    j["text_offset"] = std::move(text_offset);
    return j;
  }
};

ojson chat_logprob_entry(const Tokenizer& tok, const SampledOutput& s) {
  ojson e;
  e["token"] = token_string(tok, s.token);
  e["logprob"] = clamp_logprob(s.logprob);
  e["bytes"] = token_bytes_json(tok, s.token);
  ojson top = ojson::array();
  for (const TokenLogprobEntry& t : s.top_logprobs) {
    ojson entry;
    entry["token"] = token_string(tok, t.token);
    entry["logprob"] = clamp_logprob(t.logprob);
    entry["bytes"] = token_bytes_json(tok, t.token);
    top.push_back(std::move(entry));
  }
  e["top_logprobs"] = std::move(top);
  return e;
}

// vLLM's prompt_logprobs: null for the first prompt token (nothing precedes it), then for each
// token a map from token id (as a string) to {logprob, rank, decoded_token}, holding the prompt
// token and the top-N. A rank is the place in the top-N (1 = most likely); the prompt token's
// rank is null when it is not among them (it is not computed).
ojson prompt_logprobs_json(const Tokenizer& tok, const std::vector<TokenId>& ids,
                           const std::vector<SampledOutput>& entries) {
  ojson out = ojson::array();
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i == 0 || i - 1 >= entries.size()) {
      out.push_back(nullptr);
      continue;
    }
    const SampledOutput& s = entries[i - 1];
    ojson m = ojson::object();
    const auto put = [&](TokenId id, float logprob, ojson rank) {
      ojson e;
      e["logprob"] = clamp_logprob(logprob);
      e["rank"] = std::move(rank);
      e["decoded_token"] = token_string(tok, id);
      m[std::to_string(id)] = std::move(e);
    };
    ojson own_rank = nullptr;
    for (size_t k = 0; k < s.top_logprobs.size(); ++k) {
      if (s.top_logprobs[k].token == s.token) own_rank = static_cast<int64_t>(k + 1);
    }
    put(s.token, s.logprob, own_rank);
    for (size_t k = 0; k < s.top_logprobs.size(); ++k) {
      if (s.top_logprobs[k].token != s.token) put(s.top_logprobs[k].token, s.top_logprobs[k].logprob, static_cast<int64_t>(k + 1));
    }
    out.push_back(std::move(m));
  }
  return out;
}

ojson chat_logprobs_json(const Tokenizer& tok, const std::vector<SampledOutput>& samples) {
  ojson content = ojson::array();
  for (const SampledOutput& s : samples) content.push_back(chat_logprob_entry(tok, s));
  return {{"content", std::move(content)}};
}

}  // namespace

// ---- ResponseBuilder ------------------------------------------------------------------------------

ResponseBuilder::ResponseBuilder(const ParsedRequest& request, const Tokenizer& tokenizer, std::string id,
                                 int64_t created)
    : request_(request), tokenizer_(tokenizer), id_(std::move(id)), created_(created) {
  PAGODA_CHECK(request_.n >= 1);
  choices_.resize(request_.prompts.size() * static_cast<size_t>(request_.n));
  for (const GenerateRequest& g : request_.prompts) {
    prompt_tokens_.push_back(static_cast<int64_t>(g.prompt_token_ids.size()));
    cached_tokens_.push_back(0);
  }
}

ResponseBuilder::Choice& ResponseBuilder::choice(size_t prompt_index, const OutputChunk& chunk) {
  // Chunks come from the engine for this request: an index outside it is a bug.
  PAGODA_CHECK(prompt_index < request_.prompts.size());
  PAGODA_CHECK(chunk.index >= 0 && chunk.index < request_.n);
  return choices_[prompt_index * static_cast<size_t>(request_.n) + static_cast<size_t>(chunk.index)];
}

void ResponseBuilder::record(size_t prompt_index, Choice& c, const OutputChunk& chunk) {
  if (!chunk.finished() || !c.finish_reason.empty()) return;
  c.finish_reason = finish_reason_name(chunk.finish_reason);
  if (chunk.finish_reason == FinishReason::kStop) {
    // vLLM's stop_reason: the stop string, or a stop token id other than the model's EOS (an
    // EOS stop reports null).
    const std::optional<TokenId> eos = tokenizer_.eos_id();
    if (!chunk.stop_string.empty()) {
      c.stop_reason_text = chunk.stop_string;
    } else if (chunk.stop_token >= 0 && (!eos || chunk.stop_token != *eos)) {
      c.stop_reason_token = chunk.stop_token;
    }
  }
  if (chunk.prompt_tokens > 0) prompt_tokens_[prompt_index] = chunk.prompt_tokens;
  cached_tokens_[prompt_index] = std::max(cached_tokens_[prompt_index], chunk.cached_tokens);
  completion_tokens_ +=
      chunk.completion_tokens > 0 ? chunk.completion_tokens : static_cast<int64_t>(c.token_ids.size());
  ++finished_;
}

bool ResponseBuilder::all_finished() const { return finished_ == choices_.size(); }

void ResponseBuilder::add(size_t prompt_index, const OutputChunk& chunk) {
  Choice& c = choice(prompt_index, chunk);
  c.text += chunk.text;
  c.token_ids.insert(c.token_ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
  c.logprobs.insert(c.logprobs.end(), chunk.logprobs.begin(), chunk.logprobs.end());
  c.prompt_logprobs.insert(c.prompt_logprobs.end(), chunk.prompt_logprobs.begin(), chunk.prompt_logprobs.end());
  record(prompt_index, c, chunk);
}

namespace {

ojson finish_json(const std::string& reason) { return reason.empty() ? ojson(nullptr) : ojson(reason); }

ojson stop_reason_json(const std::optional<std::string>& text, const std::optional<TokenId>& token) {
  if (text) return *text;
  if (token) return *token;
  return nullptr;
}

ojson envelope(const std::string& id, const char* object, int64_t created, const std::string& model) {
  ojson j;
  j["id"] = id;
  j["object"] = object;
  j["created"] = created;
  j["model"] = model;
  return j;
}

ojson usage_of(const std::vector<int64_t>& prompt_tokens, const std::vector<int64_t>& cached_tokens,
               int64_t completion_tokens) {
  int64_t prompt = 0, cached = 0;
  for (int64_t t : prompt_tokens) prompt += t;
  for (int64_t t : cached_tokens) cached += t;
  return usage_json(prompt, completion_tokens, cached);
}

// The prompt's tokens as logprob entries (echo): the first has no logprob; prompt_logprobs[i]
// is for prompt token i + 1. Entries that never arrived are sent without a logprob.
void add_prompt_logprobs(const Tokenizer& tok, const std::vector<TokenId>& ids,
                         const std::vector<SampledOutput>& prompt_logprobs, CompletionLogprobs& lp, int64_t& offset) {
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i == 0 || i - 1 >= prompt_logprobs.size()) {
      lp.add_bare(tok, ids[i], offset);
    } else {
      lp.add(tok, prompt_logprobs[i - 1], offset);
    }
  }
}

}  // namespace

std::string ResponseBuilder::tool_call_id(size_t choice_index, int call_index) const {
  // FNV-1a over the response id and the call's place, twice: 24 hex digits, like OpenAI's ids.
  const std::string key = id_ + "/" + std::to_string(choice_index) + "/" + std::to_string(call_index);
  std::string out = "call_";
  for (uint64_t salt : {0xcbf29ce484222325ull, 0x84222325cbf29ce4ull}) {
    uint64_t h = salt;
    for (char ch : key) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out.append(buf, out.size() == 5 ? 16 : 8);
  }
  return out;
}

ojson ResponseBuilder::chat_message(size_t choice_index, const std::string& text, bool& calls) const {
  const ParsedOutput parsed = parse_output(text, request_.reasoning, request_.tool_parser);
  std::string content = parsed.content;
  std::vector<ParsedToolCall> tool_calls = parsed.tool_calls;
  const auto forced = request_.tools.choice;
  if (forced == ToolRequest::Choice::kNamed || forced == ToolRequest::Choice::kRequired) {
    tool_calls = forced_tool_calls(request_.tools, content);
    if (!tool_calls.empty()) content.clear();
  }
  // (A named tool_choice finishes with "stop", as OpenAI's and vLLM's do.)
  calls = !tool_calls.empty() && forced != ToolRequest::Choice::kNamed;
  ojson m;
  m["role"] = "assistant";
  m["content"] = !tool_calls.empty() && content.empty() ? ojson(nullptr) : ojson(content);
  if (parsed.reasoning) {
    m["reasoning_content"] = *parsed.reasoning;  // vLLM's older name, which many clients read
    m["reasoning"] = *parsed.reasoning;
  }
  if (!tool_calls.empty()) {
    ojson list = ojson::array();
    for (size_t i = 0; i < tool_calls.size(); ++i) {
      list.push_back({{"id", tool_call_id(choice_index, static_cast<int>(i))},
                      {"type", "function"},
                      {"function", {{"name", tool_calls[i].name}, {"arguments", tool_calls[i].arguments}}}});
    }
    m["tool_calls"] = std::move(list);
  }
  return m;
}

ojson ResponseBuilder::chat_delta(size_t choice_index, Choice& c, const std::string& text, bool finished) {
  if (!c.parts) c.parts = std::make_unique<OutputStream>(request_.reasoning, request_.tool_parser);
  OutputDelta d = c.parts->push(text);
  if (finished) {
    OutputDelta rest = c.parts->finish();
    d.content += rest.content;
    d.reasoning += rest.reasoning;
    for (ToolCallDelta& t : rest.tool_calls) {
      // One entry per call in a chunk: the rest of a call this push() already began joins it.
      if (!d.tool_calls.empty() && d.tool_calls.back().index == t.index) {
        if (t.name) d.tool_calls.back().name = t.name;
        d.tool_calls.back().arguments += t.arguments;
      } else {
        d.tool_calls.push_back(std::move(t));
      }
    }
  }
  ojson delta = ojson::object();
  if (!d.reasoning.empty()) {
    delta["reasoning_content"] = d.reasoning;
    delta["reasoning"] = d.reasoning;
  }
  auto call_json = [&](int index, const std::optional<std::string>& name, const std::string& arguments) {
    ojson j;
    j["index"] = index;
    if (name) {
      j["id"] = tool_call_id(choice_index, index);
      j["type"] = "function";
      j["function"] = {{"name", *name}, {"arguments", arguments}};
    } else {
      j["function"] = {{"arguments", arguments}};
    }
    return j;
  };
  ojson calls = ojson::array();
  switch (request_.tools.choice) {
    case ToolRequest::Choice::kNamed:
      // The answer is the call's arguments, streamed as they come.
      if (!d.content.empty()) {
        const bool first = c.calls_sent == 0;
        calls.push_back(call_json(0, first ? std::optional<std::string>(request_.tools.named) : std::nullopt, d.content));
        c.calls_sent = 1;
      }
      break;
    case ToolRequest::Choice::kRequired:
      // An array of calls: each is sent whole once the output is.
      c.forced += d.content;
      if (finished) {
        const std::vector<ParsedToolCall> all = forced_tool_calls(request_.tools, c.forced);
        for (size_t i = 0; i < all.size(); ++i) calls.push_back(call_json(static_cast<int>(i), all[i].name, all[i].arguments));
        c.calls_sent = static_cast<int>(all.size());
        if (all.empty() && !c.forced.empty()) delta["content"] = c.forced;  // cut short: the text as it is
      }
      break;
    default:
      if (!d.content.empty()) delta["content"] = d.content;
      for (const ToolCallDelta& t : d.tool_calls) {
        calls.push_back(call_json(t.index, t.name, t.arguments));
        c.calls_sent = std::max(c.calls_sent, t.index + 1);
      }
  }
  if (!calls.empty()) delta["tool_calls"] = std::move(calls);
  return delta;
}

std::string ResponseBuilder::body() const {
  const bool chat = request_.endpoint == Endpoint::kChat;
  ojson out = envelope(id_, chat ? "chat.completion" : "text_completion", created_, request_.model);
  ojson choices = ojson::array();
  for (size_t k = 0; k < choices_.size(); ++k) {
    const Choice& c = choices_[k];
    const size_t p = k / static_cast<size_t>(request_.n);
    ojson j;
    j["index"] = k;
    bool calls = false;
    if (chat) {
      j["message"] = chat_message(k, c.text, calls);
      j["logprobs"] = request_.logprobs ? chat_logprobs_json(tokenizer_, c.logprobs) : ojson(nullptr);
    } else {
      j["text"] = request_.echo ? request_.prompt_texts[p] + c.text : c.text;
      if (request_.logprobs) {
        CompletionLogprobs lp;
        int64_t offset = 0;
        if (request_.echo) {
          add_prompt_logprobs(tokenizer_, request_.prompts[p].prompt_token_ids, c.prompt_logprobs, lp, offset);
        }
        for (const SampledOutput& s : c.logprobs) lp.add(tokenizer_, s, offset);
        j["logprobs"] = std::move(lp).to_json();
      } else {
        j["logprobs"] = nullptr;
      }
    }
    j["finish_reason"] = finish_json(calls && c.finish_reason == "stop" ? "tool_calls" : c.finish_reason);
    j["stop_reason"] = stop_reason_json(c.stop_reason_text, c.stop_reason_token);
    if (request_.prompt_logprobs) {
      j["prompt_logprobs"] = prompt_logprobs_json(tokenizer_, request_.prompts[p].prompt_token_ids, c.prompt_logprobs);
    }
    choices.push_back(std::move(j));
  }
  out["choices"] = std::move(choices);
  out["usage"] = usage_of(prompt_tokens_, cached_tokens_, completion_tokens_);
  if (request_.kv_answer && !choices_.empty()) {
    // A prefill request's answer: where the decode instance finds the prompt's KV, and the first
    // token it goes on from.
    KvTransferParams answer = *request_.kv_answer;
    const Choice& c = choices_[0];
    if (!c.token_ids.empty()) {
      KvFirstToken first;
      first.token = c.token_ids[0];
      if (!c.logprobs.empty()) {
        first.logprob = c.logprobs[0].logprob;
        for (const TokenLogprobEntry& e : c.logprobs[0].top_logprobs) first.top_logprobs.emplace_back(e.token, e.logprob);
      }
      answer.first_token = std::move(first);
    }
    out["kv_transfer_params"] = ojson::parse(answer.to_json());
  }
  return dump(out);
}

std::string ResponseBuilder::stream_events(size_t prompt_index, const OutputChunk& chunk) {
  const bool chat = request_.endpoint == Endpoint::kChat;
  Choice& c = choice(prompt_index, chunk);
  const size_t index = prompt_index * static_cast<size_t>(request_.n) + static_cast<size_t>(chunk.index);
  const bool first = !c.started;
  c.started = true;
  c.token_ids.insert(c.token_ids.end(), chunk.token_ids.begin(), chunk.token_ids.end());
  record(prompt_index, c, chunk);
  const bool finished = chunk.finished();
  const auto event = [&](ojson choice) {
    ojson j = envelope(id_, chat ? "chat.completion.chunk" : "text_completion", created_, request_.model);
    j["choices"] = ojson::array({std::move(choice)});
    if (request_.include_usage) j["usage"] = nullptr;
    return sse(j);
  };

  std::string events;
  if (chat) {
    if (first) {
      ojson role;
      role["index"] = index;
      role["delta"] = {{"role", "assistant"}, {"content", ""}};
      role["logprobs"] = nullptr;
      role["finish_reason"] = nullptr;
      events += event(std::move(role));
    }
    const bool has_logprobs = request_.logprobs && !chunk.logprobs.empty();
    if (chunk.text.empty() && !has_logprobs && !finished) return events;
    ojson delta;
    if (!request_.reasoning && !request_.tool_parser && request_.tools.choice != ToolRequest::Choice::kNamed &&
        request_.tools.choice != ToolRequest::Choice::kRequired) {
      delta = chunk.text.empty() && finished ? ojson::object() : ojson({{"content", chunk.text}});
    } else {
      delta = chat_delta(index, c, chunk.text, finished);
      if (delta.empty() && !has_logprobs && !finished) return events;  // all held back for now
    }
    ojson j;
    j["index"] = index;
    j["delta"] = std::move(delta);
    j["logprobs"] = has_logprobs ? chat_logprobs_json(tokenizer_, chunk.logprobs) : ojson(nullptr);
    const bool calls = c.calls_sent > 0 && c.finish_reason == "stop" && request_.tools.choice != ToolRequest::Choice::kNamed;
    j["finish_reason"] = finish_json(finished ? (calls ? "tool_calls" : c.finish_reason) : "");
    if (finished) j["stop_reason"] = stop_reason_json(c.stop_reason_text, c.stop_reason_token);
    return events + event(std::move(j));
  }

  const bool echo_now = first && request_.echo;
  std::string text = echo_now ? request_.prompt_texts[prompt_index] + chunk.text : chunk.text;
  const bool has_logprobs =
      request_.logprobs && (!chunk.logprobs.empty() || echo_now || (request_.echo && !chunk.prompt_logprobs.empty()));
  if (text.empty() && !has_logprobs && !finished && !echo_now) return events;
  ojson j;
  j["index"] = index;
  j["text"] = std::move(text);
  if (has_logprobs) {
    CompletionLogprobs lp;
    if (echo_now) {
      add_prompt_logprobs(tokenizer_, request_.prompts[prompt_index].prompt_token_ids, chunk.prompt_logprobs, lp,
                          c.text_offset);
    } else if (request_.echo) {
      // Prompt logprobs that arrive after the first chunk (not what the engine does today).
      for (const SampledOutput& s : chunk.prompt_logprobs) lp.add(tokenizer_, s, c.text_offset);
    }
    for (const SampledOutput& s : chunk.logprobs) lp.add(tokenizer_, s, c.text_offset);
    j["logprobs"] = std::move(lp).to_json();
  } else {
    j["logprobs"] = nullptr;
  }
  j["finish_reason"] = finish_json(finished ? c.finish_reason : "");
  j["stop_reason"] = finished ? stop_reason_json(c.stop_reason_text, c.stop_reason_token) : ojson(nullptr);
  return event(std::move(j));
}

std::string ResponseBuilder::stream_end() {
  std::string events;
  if (request_.include_usage) {
    ojson j = envelope(id_, request_.endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion",
                       created_, request_.model);
    j["choices"] = ojson::array();
    j["usage"] = usage_of(prompt_tokens_, cached_tokens_, completion_tokens_);
    events += sse(j);
  }
  return events + "data: [DONE]\n\n";
}

std::string stream_error_events(const ApiError& error) { return "data: " + error.to_json() + "\n\ndata: [DONE]\n\n"; }

// ---- /v1/models ---------------------------------------------------------------------------------

std::string models_list(const ModelContext& model, const std::string& root, int64_t created) {
  ojson data = ojson::array();
  for (const std::string& name : model.served_model_names) {
    ojson m;
    m["id"] = name;
    m["object"] = "model";
    m["created"] = created;
    m["owned_by"] = "pagoda";
    m["root"] = root;
    m["parent"] = nullptr;
    m["max_model_len"] = model.max_model_len;
    data.push_back(std::move(m));
  }
  ojson out;
  out["object"] = "list";
  out["data"] = std::move(data);
  return dump(out);
}

}  // namespace pagoda::server
