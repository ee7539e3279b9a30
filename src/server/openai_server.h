// OpenAiServer: the OpenAI-compatible HTTP API over an Engine, as `vllm serve` offers it:
// /v1/completions, /v1/chat/completions (both with SSE streaming), /v1/models, /health,
// /metrics (Prometheus, vLLM's names), /tokenize, /detokenize, /version.
//
// Request path: an I/O thread parses and validates the body (openai_request), tokenizes, and
// submits to the engine with a callback; the engine thread's chunks are posted back to the
// connection's strand, turned into JSON there (never on the engine thread) and written. A client
// that goes away aborts its request; the engine frees its blocks within one step.
//
// Lifecycle: start() listens at once and answers /health with 503 while the model loads;
// set_model() makes it ready. shutdown() is the SIGTERM path: health turns 503 and new work gets
// 503 at once, in-flight requests run to completion for up to the timeout, the rest are aborted
// (streams end with an error event and [DONE]), then every connection closes.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine.h"
#include "metrics/engine_metrics.h"
#include "server/http_server.h"
#include "server/output_parsers.h"
#include "server/openai_request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace pagoda::server {

struct ServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 8000;                        // 0 = any free port (tests)
  std::string api_key;                         // "" = no authentication
  bool metrics_no_auth = false;                // /metrics without the key
  bool log_requests = true;                    // one line per request (ids and sizes, no text)
  std::chrono::milliseconds stats_interval{10000};  // the periodic throughput line; 0 = never
  // /health fails, and new inference requests get 503, when the engine loop has made no progress
  // for this long.
  std::chrono::milliseconds stall_timeout{60000};
  ProtocolLimits limits;
  HttpLimits http;
  int io_threads = 2;
  StructuredOutputsConfig structured_outputs;  // --structured-outputs-config
};

// Everything the routes need about the served model. The engine and tokenizer outlive the server.
struct ServedModel {
  Engine* engine = nullptr;
  std::shared_ptr<const Tokenizer> tokenizer;
  std::optional<ChatTemplate> chat_template;
  std::string bos_token, eos_token;
  std::vector<std::string> served_model_names;  // not empty
  std::string root;                             // the model path, reported by /v1/models
  std::shared_ptr<metrics::EngineMetrics> metrics;
  GenerationDefaults generation_defaults;       // --generation-config: request defaults
  // --reasoning-parser, --tool-call-parser and --enable-auto-tool-choice (output_parsers.h).
  std::shared_ptr<const ReasoningParser> reasoning_parser;
  std::shared_ptr<const ToolParser> tool_parser;
  bool enable_auto_tool_choice = false;
};

class OpenAiServer {
 public:
  // Listens on host:port; until set_model(), /health answers 503 and the API routes 503.
  static Result<std::unique_ptr<OpenAiServer>> start(ServerConfig config);
  ~OpenAiServer();

  void set_model(ServedModel model);
  uint16_t port() const;

  // Stops taking work, lets in-flight requests finish for up to `timeout`, aborts the rest,
  // waits for their responses to go out (a few seconds at most; requests that an engine stuck in
  // a step cannot end fail then with a server_error), and closes every connection.
  void shutdown(std::chrono::milliseconds timeout);

  struct Impl;

 private:
  explicit OpenAiServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Constant-time equality (the time depends on the lengths only), for API keys.
bool constant_time_equal(std::string_view a, std::string_view b);

}  // namespace pagoda::server
