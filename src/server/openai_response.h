// OpenAI protocol, responses: the engine's output chunks for a parsed request (openai_request.h)
// turned into OpenAI response objects and server-sent-event chunks, field for field as the
// OpenAI API reference (and vLLM's extensions: stop_reason, prompt_logprobs, prompt_token_ids-free
// usage details) shapes them; the error event that ends a failed stream; /v1/models.
//
// No I/O, no threads, like the parser: the routes (openai_server) feed a builder and write what it
// returns.
#pragma once

#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_types.h"
#include "server/openai_common.h"
#include "server/openai_request.h"
#include "server/output_parsers.h"
#include "tokenizer/tokenizer.h"

namespace pagoda::server {

// Builds the response of one request from the engine's chunks. Not thread-safe: one builder
// per request, fed in the order the chunks arrive.
class ResponseBuilder {
 public:
  // `id` is the response id ("cmpl-..." / "chatcmpl-..."), `created` unix seconds.
  ResponseBuilder(const ParsedRequest& request, const Tokenizer& tokenizer, std::string id,
                  int64_t created);

  // Non-streaming: add every chunk of prompt `prompt_index`, then body() once all finished.
  void add(size_t prompt_index, const OutputChunk& chunk);
  // text_completion / chat.completion, with usage (prompt_tokens counted once per prompt,
  // completion_tokens over all choices, prompt_tokens_details.cached_tokens). Each choice has
  // vLLM's stop_reason: the stop string, or the stop token id when one other than the
  // tokenizer's EOS ended it, else null. Logprobs of -inf are sent as -9999.0, as OpenAI does.
  std::string body() const;

  // Streaming: the SSE events ("data: {...}\n\n", possibly several, possibly none) for this
  // chunk. Chat sends {"role":"assistant","content":""} as the first delta of each choice; the
  // last chunk of a choice carries its finish_reason. With include_usage every chunk has
  // "usage": null.
  std::string stream_events(size_t prompt_index, const OutputChunk& chunk);
  // When every choice has finished: the usage chunk (choices: []) if include_usage, then
  // "data: [DONE]\n\n".
  std::string stream_end();

  bool all_finished() const;

 private:
  struct Choice {
    std::string text;
    std::vector<TokenId> token_ids;
    std::vector<SampledOutput> logprobs;
    std::vector<SampledOutput> prompt_logprobs;
    std::string finish_reason;           // "" while running
    std::optional<std::string> stop_reason_text;
    std::optional<TokenId> stop_reason_token;
    bool started = false;                // streaming: the first event was sent
    int64_t text_offset = 0;             // completions logprobs: bytes of text so far
    // Chat streaming: the thinking and the calls taken apart (output_parsers.h), and what a
    // forced tool_choice's output holds so far.
    std::unique_ptr<OutputStream> parts;
    std::string forced;
    int calls_sent = 0;
  };
  // The chat message of a whole output: content, reasoning, tool calls; `calls` is set to
  // whether there were any.
  nlohmann::ordered_json chat_message(size_t choice_index, const std::string& text, bool& calls) const;
  // Chat streaming: the delta of a choice's new text (and, when `finished`, of what was held).
  nlohmann::ordered_json chat_delta(size_t choice_index, Choice& c, const std::string& text, bool finished);
  // A tool call's id: unique in the response, the same for a call whether streamed or not.
  std::string tool_call_id(size_t choice_index, int call_index) const;
  // The choice a chunk of prompt `prompt_index` belongs to (PAGODA_CHECKs the indices).
  Choice& choice(size_t prompt_index, const OutputChunk& chunk);
  // Bookkeeping for a chunk whose text and tokens `c` already holds: finish reason, stop
  // reason and usage when it is the choice's last.
  void record(size_t prompt_index, Choice& c, const OutputChunk& chunk);

  const ParsedRequest& request_;
  const Tokenizer& tokenizer_;
  std::string id_;
  int64_t created_;
  std::vector<Choice> choices_;          // prompts.size() * n
  std::vector<int64_t> prompt_tokens_;   // per prompt, from the last chunk of any of its choices
  std::vector<int64_t> cached_tokens_;
  int64_t completion_tokens_ = 0;
  size_t finished_ = 0;
};

// One SSE event carrying an error (after a stream has begun), then "data: [DONE]\n\n".
std::string stream_error_events(const ApiError& error);

// /v1/models: {"object":"list","data":[{"id", "object":"model", "created", "owned_by":"pagoda",
// "root", "parent": null, "max_model_len"}]} with one entry per served name.
std::string models_list(const ModelContext& model, const std::string& root, int64_t created);

}  // namespace pagoda::server
