#include "server/openai_server.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/log.h"
#include "server/openai_response.h"

#ifndef PAGODA_VERSION
#define PAGODA_VERSION "0.0.0"
#endif

namespace pagoda::server {

bool constant_time_equal(std::string_view a, std::string_view b) {
  // Every byte of the longer string is looked at, whatever matches; only the lengths leak.
  const size_t n = std::max(a.size(), b.size());
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

namespace {

enum class State { kLoading, kReady, kDraining };

HttpResponse json_response(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.body = std::move(body);
  return r;
}

HttpResponse error_response(const ApiError& e) {
  HttpResponse r = json_response(e.status, e.to_json());
  if (e.status == 429 || e.status == 503) r.headers.emplace_back("Retry-After", "1");
  return r;
}

ApiError make_error(int status, std::string type, std::string message, std::string code = "") {
  ApiError e;
  e.status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.code = std::move(code);
  return e;
}

int64_t unix_now() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

struct OpenAiServer::Impl {
  ServerConfig config;
  std::unique_ptr<HttpServer> http;
  std::atomic<State> state{State::kLoading};
  ServedModel model;  // written once by set_model(), before state becomes kReady
  ModelContext context;
  std::unique_ptr<structured::GrammarCompiler> grammars;  // the model's constraints, compiled once
  IgnoredFieldNames ignored_fields;
  int64_t created = unix_now();
  std::atomic<int64_t> in_flight{0};  // inference requests not yet answered

  std::mutex id_mu;
  std::mt19937_64 id_rng{std::random_device{}()};

  std::mutex stats_mu;
  std::condition_variable stats_cv;
  bool stats_stop = false;
  std::thread stats_thread;

  // One completions / chat request on its way through the engine. Touched only on its
  // connection's strand (the handler, the posted chunks, the close callback).
  struct Call {
    Impl* server = nullptr;
    std::shared_ptr<Exchange> exchange;
    ParsedRequest parsed;
    std::unique_ptr<ResponseBuilder> builder;
    std::vector<RequestId> ids;
    bool done = false;  // answered, or the client left
    FinishReason failure = FinishReason::kNone;

    void on_chunk(size_t prompt, const OutputChunk& c);
    void finish();
    void close() {  // the client went away
      if (done) return;
      done = true;
      for (RequestId id : ids) server->model.engine->abort(id);
      server->in_flight.fetch_sub(1);
      server->forget(this);
    }
    void give_up() {  // the engine never answered: the request fails as if it had failed
      if (done) return;
      for (RequestId id : ids) server->model.engine->abort(id);
      failure = FinishReason::kError;
      finish();
    }
  };
  // Calls not yet answered, so that a shutdown can still answer them when the engine does not.
  std::mutex calls_mu;
  std::unordered_map<const Call*, std::shared_ptr<Call>> calls;  // guarded by calls_mu
  void forget(const Call* call) {
    std::lock_guard<std::mutex> lock(calls_mu);
    calls.erase(call);
  }

  std::string new_id(const char* prefix) {
    std::lock_guard<std::mutex> lock(id_mu);
    char buf[40];
    std::snprintf(buf, sizeof buf, "%s%016llx%08llx", prefix, static_cast<unsigned long long>(id_rng()),
                  static_cast<unsigned long long>(id_rng() & 0xffffffffu));
    return buf;
  }

  bool authorized(const HttpRequest& req) const {
    std::string_view auth = req.header("authorization");
    std::string_view key;
    if (auth.size() > 7 && (auth.substr(0, 7) == "Bearer " || auth.substr(0, 7) == "bearer ")) {
      key = auth.substr(7);
    } else {
      key = req.header("x-api-key");
    }
    return constant_time_equal(key, config.api_key);
  }

  // Why the engine loop counts as stalled (no progress for longer than stall_timeout), or "".
  std::string stall_reason(const EngineHealth& h) const {
    if (h.seconds_since_progress * 1000.0 <= static_cast<double>(config.stall_timeout.count())) return "";
    return "the engine loop has made no progress for " + std::to_string(static_cast<int64_t>(h.seconds_since_progress)) +
           " s";
  }

  std::optional<HttpResponse> refuse(const HttpRequest& req) const;
  void handle(HttpRequest&& req, std::shared_ptr<Exchange> ex);
  void generate(Endpoint endpoint, const HttpRequest& req, const std::shared_ptr<Exchange>& ex);
  // A request that may compile a grammar (structured outputs, forced tool calls) is read on a
  // thread of its own, so that a compile (up to TokenGrammar's bound) never holds up an I/O
  // thread and the other connections it serves; at most kMaxCompiling at once, the rest 429.
  void generate_off_io(Endpoint endpoint, const HttpRequest& req, const std::shared_ptr<Exchange>& ex);
  static constexpr int kMaxCompiling = 4;
  std::atomic<int> compiling{0};
  void health(const std::shared_ptr<Exchange>& ex);
  void stats_loop();
};

void OpenAiServer::Impl::Call::on_chunk(size_t prompt, const OutputChunk& c) {
  if (done) return;
  if (c.finish_reason == FinishReason::kAbort || c.finish_reason == FinishReason::kError) {
    if (failure != FinishReason::kError) failure = c.finish_reason;
  }
  if (parsed.stream) {
    std::string events = builder->stream_events(prompt, c);
    if (failure == FinishReason::kNone) exchange->write(std::move(events));
  } else {
    builder->add(prompt, c);
  }
  if (builder->all_finished()) finish();
}

void OpenAiServer::Impl::Call::finish() {
  done = true;
  server->in_flight.fetch_sub(1);
  server->forget(this);
  if (failure != FinishReason::kNone) {
    ApiError e = failure == FinishReason::kError ? make_error(500, "server_error", "the engine failed while running this request")
                 : server->state.load() == State::kDraining
                     ? make_error(503, "server_error", "the server is shutting down; the request was aborted")
                     : make_error(500, "server_error", "the engine aborted the request");
    if (parsed.stream) {
      exchange->write(stream_error_events(e));
      exchange->end();
    } else {
      exchange->respond(error_response(e));
    }
    return;
  }
  if (parsed.stream) {
    exchange->write(builder->stream_end());
    exchange->end();
  } else {
    exchange->respond(json_response(200, builder->body()));
  }
}

void OpenAiServer::Impl::generate_off_io(Endpoint endpoint, const HttpRequest& req,
                                         const std::shared_ptr<Exchange>& ex) {
  // (A cheap look at the body: the fields that can compile a grammar. A false positive only costs
  // a thread.)
  bool may_compile = false;
  for (const char* key : {"\"response_format\"", "\"structured_outputs\"", "\"guided_", "\"tool_choice\""}) {
    may_compile = may_compile || req.body.find(key) != std::string::npos;
  }
  if (!may_compile) return generate(endpoint, req, ex);
  if (compiling.fetch_add(1) >= kMaxCompiling) {
    compiling.fetch_sub(1);
    ex->respond(error_response(make_error(429, "rate_limit_error",
                                          "too many structured-output requests are being compiled; retry",
                                          "rate_limit_exceeded")));
    return;
  }
  std::thread([this, endpoint, req, ex] {
    generate(endpoint, req, ex);
    compiling.fetch_sub(1);
  }).detach();
}

void OpenAiServer::Impl::generate(Endpoint endpoint, const HttpRequest& req, const std::shared_ptr<Exchange>& ex) {
  // A stalled engine loop takes no new work (it would only wait behind the stall): 503 with
  // Retry-After, as /health says, until the loop moves again.
  if (std::string stalled = stall_reason(model.engine->health()); !stalled.empty()) {
    ex->respond(error_response(make_error(503, "server_error", stalled + "; retry later")));
    return;
  }
  ApiResult<ParsedRequest> parsed = endpoint == Endpoint::kChat ? parse_chat_request(req.body, context)
                                                                : parse_completion_request(req.body, context);
  if (auto* err = std::get_if<ApiError>(&parsed)) {
    ex->respond(error_response(*err));
    return;
  }
  for (const std::string& name : ignored_fields.first_seen(std::get<ParsedRequest>(parsed).ignored_fields)) {
    log_line(LogLevel::kWarning, "server", "ignoring the unknown request field '" + name + "' (warned once per name)");
  }
  auto call = std::make_shared<Call>();
  call->server = this;
  call->exchange = ex;
  call->parsed = std::move(std::get<ParsedRequest>(parsed));
  const std::string id = new_id(endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-");
  call->builder = std::make_unique<ResponseBuilder>(call->parsed, *model.tokenizer, id, unix_now());

  in_flight.fetch_add(1);
  Engine& engine = *model.engine;
  for (size_t p = 0; p < call->parsed.prompts.size(); ++p) {
    Result<RequestId> submitted = unavailable("the server is shutting down");
    try {
      submitted = engine.submit(call->parsed.prompts[p], [call, p](OutputChunk&& c) {
        // Engine thread: hand the chunk to the connection's strand; JSON is built there.
        call->exchange->post([call, p, c = std::move(c)] { call->on_chunk(p, c); });
      });
    } catch (const std::exception& e) {  // out of memory: this request fails, not the server
      submitted = internal_error(std::string("could not start the request: ") + e.what());
    }
    if (!submitted.ok()) {
      for (RequestId sent : call->ids) engine.abort(sent);
      call->done = true;
      in_flight.fetch_sub(1);
      const Status& st = submitted.status();
      if (st.code() == StatusCode::kResourceExhausted) {
        ex->respond(error_response(make_error(429, "rate_limit_error", st.message(), "rate_limit_exceeded")));
      } else if (st.code() == StatusCode::kUnavailable) {
        ex->respond(error_response(make_error(503, "server_error", st.message())));
      } else if (st.code() == StatusCode::kInternal) {
        ex->respond(error_response(make_error(500, "server_error", st.message())));
      } else {
        ex->respond(error_response(bad_request(st.message())));
      }
      return;
    }
    call->ids.push_back(*submitted);
  }
  {
    std::lock_guard<std::mutex> lock(calls_mu);
    calls.emplace(call.get(), call);
  }
  ex->on_close([call] { call->close(); });
  if (call->parsed.stream) ex->begin_stream(200, "text/event-stream", {});
  if (config.log_requests) {
    int64_t tokens = 0;
    for (const GenerateRequest& g : call->parsed.prompts) tokens += static_cast<int64_t>(g.prompt_token_ids.size());
    const SamplingParams& sp = call->parsed.prompts.front().params;
    log_line(LogLevel::kInfo, "server",
             "request " + id + " from " + req.remote + ": " + std::to_string(call->parsed.prompts.size()) +
                 " prompt(s), " + std::to_string(tokens) + " prompt tokens, n=" + std::to_string(call->parsed.n) +
                 ", max_tokens=" + std::to_string(sp.max_tokens) + (call->parsed.stream ? ", stream" : ""));
  }
}

void OpenAiServer::Impl::health(const std::shared_ptr<Exchange>& ex) {
  const State s = state.load();
  if (s == State::kLoading) {
    ex->respond(error_response(make_error(503, "server_error", "the model is loading")));
    return;
  }
  if (s == State::kDraining) {
    ex->respond(error_response(make_error(503, "server_error", "the server is shutting down")));
    return;
  }
  const EngineHealth h = model.engine->health();
  if (h.failed) {
    ex->respond(error_response(make_error(503, "server_error", "the engine has failed: " + h.error)));
  } else if (h.stopping) {
    ex->respond(error_response(make_error(503, "server_error", "the engine is stopping")));
  } else if (std::string stalled = stall_reason(h); !stalled.empty()) {
    ex->respond(error_response(make_error(503, "server_error", stalled)));
  } else {
    HttpResponse r;
    r.content_type = "text/plain";
    ex->respond(std::move(r));
  }
}

// Authentication, route and method: decided from the request line and headers alone, so the
// HTTP layer calls this (its head check) before reading a body; handle() only sees requests it
// let through.
std::optional<HttpResponse> OpenAiServer::Impl::refuse(const HttpRequest& req) const {
  struct Route {
    const char* path;
    const char* method;
  };
  static constexpr Route kRoutes[] = {
      {"/health", "GET"},        {"/metrics", "GET"},          {"/version", "GET"},
      {"/v1/models", "GET"},     {"/v1/completions", "POST"},  {"/v1/chat/completions", "POST"},
      {"/tokenize", "POST"},     {"/detokenize", "POST"},
  };
  // Routing and authentication look at the same string, the path exactly as sent: "/V1/models",
  // "//v1/models" or "/v1/%6dodels" are not routes, and only /health (and /metrics when asked)
  // skip the key, so no spelling of a path reaches inference without it.
  const std::string& path = req.path;
  const bool is_public = path == "/health" || (config.metrics_no_auth && path == "/metrics");
  if (!config.api_key.empty() && !is_public && !authorized(req)) {
    HttpResponse r = error_response(
        make_error(401, "authentication_error", "invalid or missing API key (Authorization: Bearer ...)", "invalid_api_key"));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
  }
  const Route* route = nullptr;
  for (const Route& r : kRoutes) {
    if (path == r.path) route = &r;
  }
  if (!route) return error_response(make_error(404, "not_found_error", "no such route", "not_found"));
  // HEAD is GET without the body (the HTTP layer leaves the body out).
  if (req.method != route->method && !(req.method == "HEAD" && std::string_view(route->method) == "GET")) {
    HttpResponse r = error_response(make_error(
        405, "invalid_request_error", std::string("method not allowed; use ") + route->method, "method_not_allowed"));
    r.headers.emplace_back("Allow", route->method);
    return r;
  }
  return std::nullopt;
}

void OpenAiServer::Impl::handle(HttpRequest&& req, std::shared_ptr<Exchange> ex) {
  const std::string& path = req.path;
  if (path == "/health") return health(ex);
  if (path == "/version") {
    ex->respond(json_response(200, std::string(R"({"version":")") + PAGODA_VERSION + "\"}"));
    return;
  }
  const State s = state.load();
  if (s != State::kReady) {
    ex->respond(error_response(make_error(
        503, "server_error", s == State::kLoading ? "the model is loading" : "the server is shutting down")));
    return;
  }
  if (path == "/metrics") {
    HttpResponse r;
    r.content_type = "text/plain; version=0.0.4; charset=utf-8";
    r.body = model.metrics ? model.metrics->render() : std::string();
    ex->respond(std::move(r));
  } else if (path == "/v1/models") {
    ex->respond(json_response(200, models_list(context, model.root, created)));
  } else if (path == "/v1/completions") {
    generate_off_io(Endpoint::kCompletions, req, ex);
  } else if (path == "/v1/chat/completions") {
    generate_off_io(Endpoint::kChat, req, ex);
  } else if (path == "/tokenize" || path == "/detokenize") {
    ApiResult<std::string> r =
        path == "/tokenize" ? handle_tokenize(req.body, context) : handle_detokenize(req.body, context);
    if (auto* err = std::get_if<ApiError>(&r)) {
      ex->respond(error_response(*err));
    } else {
      ex->respond(json_response(200, std::move(std::get<std::string>(r))));
    }
  } else {  // refuse() let no other path through
    ex->respond(error_response(make_error(404, "not_found_error", "no such route", "not_found")));
  }
}

// vLLM's periodic line: throughput since the last line, queue sizes, KV use, prefix hit rate.
// Quiet while idle.
void OpenAiServer::Impl::stats_loop() {
  metrics::EngineMetrics::Snapshot last;
  auto last_time = std::chrono::steady_clock::now();
  bool last_idle = true;
  std::unique_lock<std::mutex> lock(stats_mu);
  for (;;) {
    stats_cv.wait_for(lock, config.stats_interval, [&] { return stats_stop; });
    if (stats_stop) return;
    if (state.load() == State::kLoading || !model.metrics) continue;
    const auto now = std::chrono::steady_clock::now();
    const metrics::EngineMetrics::Snapshot cur = model.metrics->snapshot();
    const double dt = std::max(1e-3, std::chrono::duration<double>(now - last_time).count());
    const bool idle = cur.running == 0 && cur.waiting == 0 && cur.prompt_tokens == last.prompt_tokens &&
                      cur.generation_tokens == last.generation_tokens;
    if (!(idle && last_idle)) {
      const double queries = cur.prefix_queries - last.prefix_queries;
      const double hit_rate = queries > 0 ? 100.0 * (cur.prefix_hits - last.prefix_hits) / queries : 0.0;
      char line[320];
      std::snprintf(line, sizeof line,
                    "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                    "Running: %.0f reqs, Waiting: %.0f reqs, KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                    (cur.prompt_tokens - last.prompt_tokens) / dt, (cur.generation_tokens - last.generation_tokens) / dt,
                    cur.running, cur.waiting, 100.0 * cur.kv_usage, hit_rate);
      std::string text = line;
      if (model.metrics->num_engines() > 1) {  // the sums above; each replica's share after
        std::string running, waiting;
        for (int e = 0; e < model.metrics->num_engines(); ++e) {
          const metrics::EngineMetrics::Snapshot one = model.metrics->snapshot(e);
          running += (e > 0 ? " + " : "") + std::to_string(static_cast<int64_t>(one.running));
          waiting += (e > 0 ? " + " : "") + std::to_string(static_cast<int64_t>(one.waiting));
        }
        text += " (" + std::to_string(model.metrics->num_engines()) + " engines: running " + running + ", waiting " +
                waiting + ")";
      }
      log_line(LogLevel::kInfo, "metrics", text);
      const double drafts = cur.spec_drafts - last.spec_drafts;
      if (drafts > 0) {  // vLLM's "SpecDecoding metrics" line, over the same interval
        const double draft_tokens = cur.spec_draft_tokens - last.spec_draft_tokens;
        const double accepted = cur.spec_accepted_tokens - last.spec_accepted_tokens;
        std::snprintf(line, sizeof line,
                      "SpecDecoding metrics: Mean acceptance length: %.2f, Accepted: %.0f tokens, Drafted: %.0f tokens, "
                      "Avg Draft acceptance rate: %.1f%%",
                      1.0 + accepted / drafts, accepted, draft_tokens,
                      draft_tokens > 0 ? 100.0 * accepted / draft_tokens : 0.0);
        log_line(LogLevel::kInfo, "metrics", line);
      }
    }
    last = cur;
    last_time = now;
    last_idle = idle;
  }
}

OpenAiServer::OpenAiServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

Result<std::unique_ptr<OpenAiServer>> OpenAiServer::start(ServerConfig config) {
  auto impl = std::make_unique<Impl>();
  impl->config = std::move(config);
  Impl* raw = impl.get();
  PAGODA_ASSIGN_OR_RETURN(
      impl->http, HttpServer::start(
                      raw->config.host, raw->config.port,
                      [raw](HttpRequest&& req, std::shared_ptr<Exchange> ex) { raw->handle(std::move(req), std::move(ex)); },
                      [raw](const HttpRequest& head) { return raw->refuse(head); }, raw->config.http,
                      raw->config.io_threads));
  if (raw->config.stats_interval.count() > 0) raw->stats_thread = std::thread([raw] { raw->stats_loop(); });
  return std::unique_ptr<OpenAiServer>(new OpenAiServer(std::move(impl)));
}

OpenAiServer::~OpenAiServer() { shutdown(std::chrono::milliseconds(0)); }

void OpenAiServer::set_model(ServedModel model) {
  Impl& s = *impl_;
  s.model = std::move(model);
  ModelContext& c = s.context;
  c.served_model_names = s.model.served_model_names;
  c.max_model_len = s.model.engine->core().config().scheduler.max_model_len;
  c.vocab_size = s.model.engine->core().model_config().vocab_size;
  c.priority_scheduling = s.model.engine->core().config().scheduler.policy == SchedulingPolicy::kPriority;
  const KvTransferConfig& kv = s.model.engine->core().config().kv_transfer;
  if (const KvTransferConfig* remote = kv.remote_part()) {
    c.kv_transfer = KvTransferEndpoint{kv.producer(), kv.consumer(), remote->engine_id, remote->kv_ip, remote->kv_port,
                                       s.model.engine->core().executor().tensor_parallel_size()};
  }
  c.tokenizer = s.model.tokenizer.get();
  c.chat_template = s.model.chat_template ? &*s.model.chat_template : nullptr;
  c.bos_token = s.model.bos_token;
  c.eos_token = s.model.eos_token;
  c.limits = s.config.limits;
  c.defaults = s.model.generation_defaults;
  // The vocabulary's trie is built by the first request with a constraint, not at start-up.
  s.grammars = structured::GrammarCompiler::for_model(s.model.tokenizer,
                                                      c.vocab_size > 0 ? c.vocab_size : c.tokenizer->vocab_size());
  c.structured.grammars = s.grammars.get();
  c.structured.config = s.config.structured_outputs;
  c.structured.max_json_depth = c.limits.max_json_depth;
  c.tools.parser = s.model.tool_parser.get();
  c.tools.enable_auto_tool_choice = s.model.enable_auto_tool_choice;
  c.reasoning = s.model.reasoning_parser.get();
  if (c.reasoning) {
    // The end of thinking as one token, where structured outputs start.
    const std::vector<TokenId> end = c.tokenizer->encode(c.reasoning->end_tag(), /*add_special=*/false);
    if (end.size() == 1) c.reasoning_end_token = end[0];
  }
  s.state.store(State::kReady);
}

uint16_t OpenAiServer::port() const { return impl_->http->port(); }

void OpenAiServer::shutdown(std::chrono::milliseconds timeout) {
  Impl& s = *impl_;
  if (!s.http) return;
  const bool had_model = s.state.load() != State::kLoading;
  s.state.store(State::kDraining);
  if (had_model) {
    Engine& engine = *s.model.engine;
    // From here on the engine itself refuses new work, so a request that passed the state check
    // just before Draining either got in (and is drained or aborted below) or gets a 503.
    engine.refuse_new("the server is shutting down");
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (engine.num_unfinished() > 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    engine.abort_all();
    // The aborted requests' answers (error events, 503s) are posted to their connections.
    const auto answered = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (s.in_flight.load() > 0 && std::chrono::steady_clock::now() < answered) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    // An engine stuck in a step (a hung rank) answers nothing: its requests fail here instead,
    // each on its connection's strand, rather than be cut off when the connections close.
    std::vector<std::shared_ptr<Impl::Call>> stuck;
    {
      std::lock_guard<std::mutex> lock(s.calls_mu);
      for (auto& [key, call] : s.calls) stuck.push_back(call);
    }
    for (auto& call : stuck) call->exchange->post([call] { call->give_up(); });
    const auto failed = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (s.in_flight.load() > 0 && std::chrono::steady_clock::now() < failed) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  // Requests still being read on their own threads (generate_off_io) finish before the server goes.
  while (s.compiling.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s.http->stop(std::chrono::seconds(2));
  s.http.reset();
  {
    std::lock_guard<std::mutex> lock(s.stats_mu);
    s.stats_stop = true;
  }
  s.stats_cv.notify_all();
  if (s.stats_thread.joinable()) s.stats_thread.join();
}

}  // namespace pagoda::server
