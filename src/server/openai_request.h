// OpenAI protocol, requests: turns the JSON bodies of /v1/completions, /v1/chat/completions,
// /tokenize and /detokenize into engine requests (and the last two into their answers), field for
// field as the OpenAI API reference and vLLM's extensions define them. openai_response.h builds
// the responses of a parsed request; the error object both use is in openai_common.h.
//
// Sits between the HTTP routes (openai_server) and the engine: no I/O, no threads. Every
// function is a pure transformation, so the whole protocol is unit-tested without a socket.
//
// Request bodies are untrusted: parsing never throws and never crashes. Nesting deeper than
// ProtocolLimits::max_json_depth is refused before the JSON library sees the body; wrong types,
// out-of-range values, unknown models, prompts that do not fit the context and template errors
// all come back as an ApiError naming the parameter. The lengths, ids and sampling parameters
// are checked by the engine's one validator (engine/request_validation.h). Unknown fields are
// ignored (as OpenAI and vLLM do) and listed in ParsedRequest::ignored_fields for the caller to
// log; fields that would change the result but are not implemented (tools, beam search,
// allowed_token_ids, bad_words, truncate_prompt_tokens, ...) are refused with a 400 naming the
// field. Structured outputs (response_format, structured_outputs, guided_*) are compiled here, in
// the caller's thread (structured_fields.h). The same parser serves `pagoda generate`, so the CLI and the server accept
// and refuse the same requests.
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine_types.h"
#include "engine/request_validation.h"
#include "server/openai_common.h"
#include "server/structured_fields.h"
#include "server/tool_fields.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace pagoda::server {

// Caps on what one request may ask for, checked before anything is allocated for it.
struct ProtocolLimits {
  int64_t max_logprobs = 20;    // --max-logprobs: logprobs / top_logprobs / prompt_logprobs
  int64_t max_n = SamplingParams::kMaxN;
  size_t max_prompts = 256;     // entries of a batched completions prompt
  int64_t max_sequences = 256;  // prompts x n of one completions request
  size_t max_messages = 4096;   // chat messages
  size_t max_logit_bias = 1024; // logit_bias entries
  int max_json_depth = 64;      // nesting of arrays and objects in a body
};

// Where this instance stands in disaggregated prefill (--kv-transfer-config with TcpConnector or
// ShmConnector): whether it takes kv_transfer_params of a prefill request (a producer) or of a
// decode request (a consumer), and where a decode instance finds what it keeps.
struct KvTransferEndpoint {
  bool producer = false;
  bool consumer = false;
  std::string engine_id;
  std::string host;  // kv_ip
  int port = 0;      // kv_port (rank r serves on port + r)
  int tp_size = 1;
};

// What parsing needs to know about the served model. Borrowed pointers; they outlive the call.
struct ModelContext {
  std::vector<std::string> served_model_names;  // not empty; a request's "model" must be one
                                                // of them (or absent)
  int64_t max_model_len = 0;
  // The model's vocabulary (its embedding rows); 0: the tokenizer's. A request's token ids (prompt,
  // logit_bias, allowed and banned ids) must be below both, since the engine checks none again.
  int64_t vocab_size = 0;
  bool priority_scheduling = false;  // --scheduling-policy priority: a request's priority counts
                                     // (with fcfs, a non-zero priority is a 400, as in vLLM)
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: chat requests get a 400 saying so
  std::string bos_token, eos_token;             // the chat template's variables
  ProtocolLimits limits;
  GenerationDefaults defaults;    // --generation-config: defaults for fields a request leaves out
  int64_t default_max_tokens = 16;  // completions' max_tokens when absent (OpenAI's 16)
  StructuredContext structured;     // structured outputs (structured_fields.h)
  ToolContext tools;                // --tool-call-parser, --enable-auto-tool-choice (tool_fields.h)
  // --reasoning-parser (output_parsers.h), and the token of its end tag when that is one token:
  // a structured output starts after it while the model thinks.
  const ReasoningParser* reasoning = nullptr;
  std::optional<TokenId> reasoning_end_token;
  KvTransferEndpoint kv_transfer;
};

enum class Endpoint { kCompletions, kChat };

// A validated completions or chat request.
struct ParsedRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;  // the served name to report in responses (the request's, or the first)
  // One engine request per prompt: completions may batch several prompts, chat has exactly one.
  // Each is tokenized (prompt_token_ids filled), length-checked against max_model_len, and
  // carries the request's SamplingParams. Choice indices: prompt p, sequence i -> p * n + i.
  std::vector<PreparedRequest> prompts;
  std::vector<std::string> prompt_texts;  // parallel to prompts: the text (for echo)
  int64_t n = 1;
  bool stream = false;
  bool include_usage = false;      // stream_options.include_usage
  bool echo = false;               // completions: the prompt is prepended to each choice
  // Completions: `logprobs` (top-N, 0..max_logprobs). Chat: `logprobs: true` with
  // `top_logprobs` (0..max_logprobs). nullopt: no logprobs in the response.
  std::optional<int64_t> logprobs;
  // vLLM's prompt_logprobs (top-N for each prompt token; not with stream). Each choice then has
  // "prompt_logprobs": [null, {"id": {"logprob", "rank", "decoded_token"}}, ...], vLLM's shape.
  std::optional<int64_t> prompt_logprobs;
  // Top-level fields the parser did not know and ignored (cut to 64 bytes each).
  std::vector<std::string> ignored_fields;
  // Chat: how the answer is read: the thinking (null: no reasoning parser) and the tool calls
  // (tool_parser: with tool_choice auto; forced ones: tools.choice required or named).
  const ReasoningParser* reasoning = nullptr;
  const ToolParser* tool_parser = nullptr;
  ToolRequest tools;
  // A prefill request (kv_transfer_params.do_remote_decode): the parameters its answer carries for
  // the decode instance, all but the first token (the response adds it).
  std::optional<KvTransferParams> kv_answer;
};

// Parses and validates a /v1/completions body. The prompt is a string, a list of strings, a
// list of token ids, or a list of lists of token ids (never empty, ids inside the vocabulary).
// Sampling fields: max_tokens (default 16), temperature, top_p, top_k, min_p, presence_penalty,
// frequency_penalty, repetition_penalty, logit_bias, seed, stop, stop_token_ids, ignore_eos,
// min_tokens, n, logprobs, echo, priority, cache_salt, include_stop_str_in_output,
// skip_special_tokens, stream, stream_options, add_special_tokens (vLLM's; default true),
// prompt_logprobs. max_tokens defaults to model.default_max_tokens; model.defaults fill the
// sampling fields left out, and their max_new_tokens caps max_tokens. A prompt is refused only
// when it gives no tokens (an empty text with a BOS-adding tokenizer is [BOS], as in vLLM).
// prompt + max_tokens beyond max_model_len is a 400 with code context_length_exceeded (param
// max_tokens, or prompt when the prompt alone leaves no room). Integer fields take JSON
// integers only (3.7 and "10" are refused, never truncated); a negative seed wraps to uint64
// (-1 is 2^64 - 1); temperature is capped at 2 and top_k at the vocabulary size; stop strings
// are at most 4 KiB.
ApiResult<ParsedRequest> parse_completion_request(std::string_view body, const ModelContext& model);

// Parses a /v1/chat/completions body: messages (role system/developer/user/assistant/tool;
// content a string, null for an assistant, or an array of {"type":"text","text":...} parts),
// max_completion_tokens or max_tokens (default: whatever is left of max_model_len), logprobs +
// top_logprobs, chat_template_kwargs (only enable_thinking is read), add_generation_prompt
// (default true), plus the sampling fields of completions. The prompt is the model's chat
// template rendered and tokenized with encode_chat() (special-token text inside messages stays
// plain text). As vLLM: text parts are joined with "\n"; "developer" messages reach the
// template as "system"; a tool message needs a tool_call_id. tools / functions (non-empty) and
// tool_choice other than "none" are refused.
ApiResult<ParsedRequest> parse_chat_request(std::string_view body, const ModelContext& model);

// What parse_chat_request makes of a body's messages, add_generation_prompt and
// chat_template_kwargs (the rendered text and its ids), reading nothing else and checking no
// length: the Python tokenizer's apply_chat_template.
ApiResult<ChatPrompt> render_chat_messages(std::string_view body, const ModelContext& model);

// The ignored-field names a caller has not warned about yet: each name is logged once per
// process (vLLM warns about fields it ignores), and at most kMaxNames are remembered, so a client
// inventing names cannot grow memory or flood the log. Thread-safe.
class IgnoredFieldNames {
 public:
  static constexpr size_t kMaxNames = 256;
  // The names of `names` seen for the first time (and remembered, while there is room).
  std::vector<std::string> first_seen(const std::vector<std::string>& names);

 private:
  std::mutex mu_;
  std::set<std::string> seen_;  // guarded by mu_
};

// Why the sampling fields of a completions body are refused, by the rules parse_completion_request
// applies, with no model yet (token ids and logprobs are bounded when a model takes the request):
// the Python SamplingParams' check when one is made, as vLLM's SamplingParams checks itself.
// Returns the 400's message, or nullopt.
std::optional<std::string> sampling_fields_problem(std::string_view body);

// /tokenize: {"prompt": str, "add_special_tokens": bool (default true)} or
// {"messages": [...], "add_generation_prompt": bool} (rendered with the chat template), with an
// optional "model". Returns the response body:
// {"count": N, "max_model_len": M, "tokens": [...], "token_strs": null}.
ApiResult<std::string> handle_tokenize(std::string_view body, const ModelContext& model);
// /detokenize: {"tokens": [ids], "model"?} -> {"prompt": "text"}. Ids outside the vocabulary
// are a 400.
ApiResult<std::string> handle_detokenize(std::string_view body, const ModelContext& model);

}  // namespace pagoda::server
