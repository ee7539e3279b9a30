// `pagoda serve MODEL`: the OpenAI-compatible server, as `vllm serve MODEL`.
//
// Start-up order: listen first (so /health can say 503 while the model loads), load the model
// and tokenizer, find the chat template, start the engine, then ready. SIGTERM / SIGINT drain
// (see OpenAiServer::shutdown) and exit 0; a second signal exits at once. A failed engine (a
// step threw) makes the server answer what is in flight with errors and exit 1.
#include <signal.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <thread>

#include "apps/pagoda/commands.h"
#include "launch/engine_setup.h"
#include "launch/ranks.h"
#include "base/log.h"
#include "server/openai_server.h"

namespace pagoda::app {

void ServeFlags::add_to(CLI::App& cmd) {
  cmd.add_option("model_tag", positional_model, "the model (same as --model)");
  add_model_flags(cmd, model, true);
  add_engine_flags(cmd, engine);
  // Frontend: everything below.
  const std::size_t first_frontend = cmd.get_options().size();
  cmd.add_option("--host", host, "address to listen on")->capture_default_str();
  cmd.add_option("--port", port, "port to listen on (0 = any free port)")->capture_default_str();
  // One name per occurrence, so that `--served-model-name a MODEL` cannot swallow the model.
  cmd.add_option("--served-model-name", served_model_names,
                 "a name clients use for the model; may be repeated (default: the model path's name)")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd.add_option("--api-key", api_key,
                 "require 'Authorization: Bearer KEY' on every route but /health (default: $PAGODA_API_KEY)");
  cmd.add_flag("--metrics-no-auth", metrics_no_auth, "serve /metrics without the API key");
  cmd.add_option("--chat-template", chat_template,
                 "chat template: a file, or the template text itself (default: the model's own)");
  cmd.add_flag("--disable-log-requests", disable_log_requests, "do not log a line per request");
  cmd.add_flag("--enable-log-requests", enable_log_requests, "log a line per request (the default here)");
  cmd.add_option("--uvicorn-log-level", uvicorn_log_level,
                 "accepted, no effect: no uvicorn here; the HTTP server logs at --log-level")
      ->capture_default_str();
  cmd.add_flag("--disable-log-stats", disable_log_stats, "do not log the periodic throughput line");
  cmd.add_option("--max-queued-requests", max_queued_requests,
                 "requests that may wait for the engine; beyond it new ones get 429 (0 = no bound)")
      ->capture_default_str();
  cmd.add_option("--shutdown-timeout", shutdown_timeout,
                 "seconds in-flight requests may run on after SIGTERM before they are aborted")
      ->capture_default_str();
  cmd.add_option("--max-request-body", max_request_body, "largest request body accepted (413 beyond)")
      ->capture_default_str();
  cmd.add_option("--health-stall-timeout", health_stall_timeout,
                 "seconds without engine progress (while it has work) after which /health and new requests get 503")
      ->capture_default_str();
  // For the server's own tests (a failing or stuck engine step); not shown in --help.
  cmd.add_option("--fault-injection", fault_injection, "")->group("");
  cmd.add_option("--reasoning-parser", reasoning_parser,
                 "put the model's thinking into message.reasoning_content: qwen3, deepseek_r1");
  cmd.add_option("--tool-call-parser", tool_call_parser,
                 "read tool calls from the model's output: hermes, llama3_json, mistral, pythonic");
  cmd.add_flag("--enable-auto-tool-choice", enable_auto_tool_choice,
               "let the model choose to call tools (tool_choice auto; needs --tool-call-parser)");
  cmd.add_option("--structured-outputs-config", structured_outputs_config,
                 "structured outputs, as vLLM's JSON: {\"backend\": \"auto\", \"disable_any_whitespace\": true}");
  cmd.add_option("--http-header-timeout", http_header_timeout,
                 "seconds a client has to send a request's headers (also the keep-alive idle limit)")
      ->capture_default_str();
  cmd.add_option("--http-write-timeout", http_write_timeout,
                 "seconds one write to a client may wait; a client that stops reading is then dropped")
      ->capture_default_str();
  cmd.add_option("--max-unsent-stream", max_unsent_stream,
                 "stream data a slow reader may leave unsent before it is dropped and its request aborted")
      ->capture_default_str();
  const std::vector<CLI::Option*> options = cmd.get_options();
  for (std::size_t i = first_frontend; i < options.size(); ++i) {
    if (!options[i]->get_group().empty()) options[i]->group(kFrontend);
  }
}

namespace {

std::atomic<int> g_signals{0};

void on_signal(int) {
  if (g_signals.fetch_add(1) >= 1) _exit(130);  // a second signal: leave now
}

// Enough descriptors for thousands of connections: the soft limit up to the hard one.
void raise_fd_limit() {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
}

// --fault-injection: "throw-at-step:N" makes step N throw; "stall-at-step:N" makes it hang;
// "stall-at-step:N:S" makes it stall for S seconds and then go on.
Result<std::function<void(int64_t)>> fault_hook(const std::string& spec) {
  if (spec.empty()) return std::function<void(int64_t)>();
  const auto bad = [&] {
    return invalid_argument("--fault-injection must be throw-at-step:N, stall-at-step:N or stall-at-step:N:SECONDS, got '" +
                            spec + "'");
  };
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return bad();
  const std::string kind = spec.substr(0, colon);
  if (kind != "throw-at-step" && kind != "stall-at-step") return bad();
  // A whole non-negative decimal number at p, or -1; p moves past it.
  const auto number = [](const char*& p) -> long long {
    if (!std::isdigit(static_cast<unsigned char>(*p))) return -1;
    char* end = nullptr;
    const long long v = std::strtoll(p, &end, 10);
    p = end;
    return v;
  };
  const char* p = spec.c_str() + colon + 1;
  const long long at = number(p);
  long long seconds = -1;  // -1: for ever
  if (at >= 0 && *p == ':' && kind == "stall-at-step") {
    ++p;
    seconds = number(p);
    if (seconds < 0) return bad();
  }
  if (at < 0 || *p != '\0') return bad();
  if (kind == "throw-at-step") {
    return std::function<void(int64_t)>([at](int64_t step) {
      if (step == at) throw std::runtime_error("injected fault at step " + std::to_string(step));
    });
  }
  if (seconds >= 0) {
    return std::function<void(int64_t)>([at, seconds](int64_t step) {
      if (step == at) std::this_thread::sleep_for(std::chrono::seconds(seconds));
    });
  }
  return std::function<void(int64_t)>([at](int64_t step) {
    while (step == at) std::this_thread::sleep_for(std::chrono::hours(1));
  });
}

std::string default_served_name(const std::string& model) {
  std::string name = std::filesystem::path(model).filename().string();
  if (name.empty()) name = std::filesystem::path(model).parent_path().filename().string();
  return name.empty() ? model : name;
}

}  // namespace

int run_serve(ServeFlags f) {
  if (!f.positional_model.empty()) f.model.model = f.positional_model;
  if (f.api_key.empty()) {
    if (const char* env = std::getenv("PAGODA_API_KEY")) f.api_key = env;
  }
  static const char* const kUvicornLevels[] = {"critical", "error", "warning", "info", "debug", "trace"};
  if (std::find(std::begin(kUvicornLevels), std::end(kUvicornLevels), f.uvicorn_log_level) == std::end(kUvicornLevels)) {
    return fail(invalid_argument("--uvicorn-log-level must be critical, error, warning, info, debug or trace"));
  }
  // Every flag is checked before the port is taken: a value Pagoda cannot honour fails at once.
  if (auto config = f.engine.to_config(); !config.ok()) return fail(config.status());
  if (Status st = f.model.check(); !st.ok()) return fail(st);
  set_log_level(*parse_log_level(f.engine.log_level));  // before the first line
  if (f.disable_log_requests && f.enable_log_requests) {
    return fail(invalid_argument("--disable-log-requests and --enable-log-requests contradict each other"));
  }
  if (f.shutdown_timeout < 0) return fail(invalid_argument("--shutdown-timeout must be >= 0"));
  if (f.max_queued_requests < 0) return fail(invalid_argument("--max-queued-requests must be >= 0"));
  if (!(f.http_header_timeout > 0)) return fail(invalid_argument("--http-header-timeout must be > 0"));
  if (!(f.http_write_timeout > 0)) return fail(invalid_argument("--http-write-timeout must be > 0"));
  if (!(f.health_stall_timeout > 0)) return fail(invalid_argument("--health-stall-timeout must be > 0"));
  auto fault = fault_hook(f.fault_injection);
  if (!fault.ok()) return fail(fault.status());
  auto body_limit = parse_byte_size(f.max_request_body);
  if (!body_limit.ok()) return fail(body_limit.status());
  auto unsent_limit = parse_byte_size(f.max_unsent_stream);
  if (!unsent_limit.ok()) return fail(unsent_limit.status());
  raise_fd_limit();
  // Tensor parallelism's ranks start before any thread (the server's among them); the group
  // outlives the engine, which is declared after it.
  auto group = RankGroup::start(f.model, f.engine);
  if (!group.ok()) return fail(group.status());

  // Signals are caught from the start, so SIGTERM during loading also exits cleanly.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;  // a signal during loading must not turn a read() into an error
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Declared before the server, so that it outlives it whatever path leaves this function.
  std::unique_ptr<Engine> engine;
  server::ServerConfig sc;
  sc.host = f.host;
  sc.port = f.port;
  sc.api_key = f.api_key;
  sc.metrics_no_auth = f.metrics_no_auth;
  sc.log_requests = !f.disable_log_requests;
  if (const char* every = std::getenv("VLLM_LOG_STATS_INTERVAL")) {  // vLLM's: seconds between the lines
    char* end = nullptr;
    const double seconds = std::strtod(every, &end);
    if (end == every || *end != '\0' || !(seconds > 0 && seconds <= 86400)) {
      return fail(invalid_argument("VLLM_LOG_STATS_INTERVAL must be seconds in (0, 86400], got '" +
                                   std::string(every) + "'"));
    }
    sc.stats_interval = std::chrono::milliseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1000)));
  }
  if (f.disable_log_stats) sc.stats_interval = std::chrono::milliseconds(0);
  sc.limits.max_logprobs = f.engine.max_logprobs;
  sc.http.max_body_bytes = static_cast<size_t>(*body_limit);
  sc.http.header_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.http_header_timeout * 1000));
  sc.http.write_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.http_write_timeout * 1000));
  sc.http.max_unsent_stream_bytes = static_cast<size_t>(*unsent_limit);
  sc.stall_timeout = std::chrono::milliseconds(static_cast<int64_t>(f.health_stall_timeout * 1000));
  if (f.enable_auto_tool_choice && f.tool_call_parser.empty()) {
    return fail(invalid_argument("--enable-auto-tool-choice needs --tool-call-parser"));
  }
  std::shared_ptr<const server::ReasoningParser> reasoning_parser;
  std::shared_ptr<const server::ToolParser> tool_parser;
  if (!f.reasoning_parser.empty()) {
    auto p = server::make_reasoning_parser(f.reasoning_parser);
    if (!p.ok()) return fail(p.status());
    reasoning_parser = std::move(*p);
  }
  if (!f.tool_call_parser.empty()) {
    auto p = server::make_tool_parser(f.tool_call_parser);
    if (!p.ok()) return fail(p.status());
    tool_parser = std::move(*p);
  }
  if (!f.structured_outputs_config.empty()) {
    auto so = server::parse_structured_outputs_config(f.structured_outputs_config);
    if (!so.ok()) return fail(so.status());
    sc.structured_outputs = *so;
  }
  auto server = server::OpenAiServer::start(sc);
  if (!server.ok()) return fail(server.status());
  log_line(LogLevel::kInfo, "serve", "listening on http://" + f.host + ":" + std::to_string((*server)->port()) +
                                         " (health is 503 until the model is loaded)");

  // The tokenizer and chat template are found and checked before any weight is read, so a
  // missing tokenizer or a broken template fails in a moment, not after a long load.
  server::ServedModel served;
  auto setup = make_engine(
      f.model, f.engine,
      [&](const Tokenizer& tokenizer) -> Status {
    PAGODA_ASSIGN_OR_RETURN(ChatTemplateSource chat, find_chat_template(f.chat_template, f.model, tokenizer));
    if (chat.text.empty()) {
      log_line(LogLevel::kWarning, "serve",
               "the model has no chat template: /v1/chat/completions will answer 400 (use --chat-template)");
      return Status::ok_status();
    }
    PAGODA_ASSIGN_OR_RETURN(ChatTemplate parsed, ChatTemplate::parse(chat.text));
    served.chat_template = std::move(parsed);
    served.bos_token = chat.bos;
    served.eos_token = chat.eos;
    return Status::ok_status();
  },
      group->get());
  if (!setup.ok()) return fail(setup.status());
  log_line(LogLevel::kInfo, "serve", setup->kernels);
  const EngineCore& core = setup->engine->core();
  log_line(LogLevel::kInfo, "serve", core.kv_cache_summary());
  if (const std::string spec = core.speculative_summary(); !spec.empty()) log_line(LogLevel::kInfo, "serve", spec);
  if (!core.connector_summary().empty()) log_line(LogLevel::kInfo, "serve", core.connector_summary());

  served.served_model_names = f.served_model_names;
  if (served.served_model_names.empty()) served.served_model_names.push_back(default_served_name(f.model.model));
  served.root = f.model.model;
  served.tokenizer = setup->tokenizer;
  served.generation_defaults = setup->generation_defaults;
  served.enable_auto_tool_choice = f.enable_auto_tool_choice;
  served.reasoning_parser = reasoning_parser;
  served.tool_parser = tool_parser;
  const EngineConfig ec = core.config();
  metrics::CacheConfigInfo cache;
  cache.block_size = ec.block_size;
  cache.num_blocks = core.num_blocks();
  cache.enable_prefix_caching = ec.enable_prefix_caching;
  cache.cache_dtype = f.engine.kv_cache_dtype;
  cache.kv_offload = ec.kv_transfer.offloading();
  cache.kv_transfer = ec.kv_transfer.remote();
  std::vector<std::unique_ptr<LLMEngine>> engines;
  engines.push_back(std::move(setup->engine));
  for (auto& replica : setup->replicas) engines.push_back(std::move(replica));
  const int replicas = static_cast<int>(engines.size());
  if (replicas > 1) {
    log_line(LogLevel::kInfo, "serve",
             "data parallelism: " + std::to_string(replicas) +
                 " engine replicas, each request to the least loaded (4 x waiting + running); /metrics "
                 "labels each replica's series engine=\"0\" .. \"" + std::to_string(replicas - 1) + "\"");
  }
  served.metrics = std::make_shared<metrics::EngineMetrics>(served.served_model_names.front(), cache,
                                                            ec.scheduler.max_model_len, replicas);
  EngineOptions eo;
  eo.max_queued_requests = f.max_queued_requests;
  eo.metrics = served.metrics;
  eo.before_step = std::move(*fault);
  engine = std::make_unique<Engine>(std::move(engines), eo);
  served.engine = engine.get();
  const std::string name = served.served_model_names.front();
  (*server)->set_model(std::move(served));

  const std::string url = "http://" + f.host + ":" + std::to_string((*server)->port());
  log_line(LogLevel::kInfo, "serve", "ready: " + url + "/v1 serving '" + name + "'");
  std::fprintf(stderr,
               "\n  Try:  curl %s/v1/completions -H 'Content-Type: application/json' \\\n"
               "          -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 32}'\n\n",
               url.c_str());

  // Until a signal, or until the engine fails: a failed engine cannot recover (its loop has
  // ended every request with an error), so the server drains and exits non-zero for whoever
  // supervises it to restart it, rather than live on answering 503.
  // A tensor-parallel rank that ends fails the server even while it is idle: the group is aborted,
  // so that a step in flight fails (its requests end with the error, as above) and none starts.
  // A parallel engine whose step has not ended for longer than --distributed-timeout-seconds
  // (plus a margin: the waits that can time out do so first) has a rank that hangs where no wait
  // can time out (inside an MPI collective): the server fails as for a failed step.
  EngineHealth health;
  bool stuck = false;
  const double stuck_after = f.engine.distributed_timeout_seconds + 2;
  while (g_signals.load() == 0 && !(health = engine->health()).failed) {
    if (*group && health.seconds_since_progress > stuck_after) {
      char why[160];
      std::snprintf(why, sizeof why,
                    "no engine step has ended for %.0f s, more than --distributed-timeout-seconds %g: a rank hangs",
                    health.seconds_since_progress, f.engine.distributed_timeout_seconds);
      health.failed = stuck = true;
      health.error = why;
      break;
    }
    if (*group) {
      if (Status st = (*group)->check_workers(); !st.ok()) {
        (*group)->abort();
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
        while (!engine->health().failed && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        health.failed = true;
        health.error = st.message();
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (health.failed) {
    log_line(LogLevel::kError, "serve", "the engine has failed (" + health.error + "); exiting with status 1");
    (*server)->shutdown(std::chrono::milliseconds(0));
    if (*group) (*group)->abort();  // under mpirun, the job ends with it (a hung rank would hold it)
    if (stuck) {  // the engine thread never comes back to be joined; the forked ranks die with us
      std::fflush(nullptr);
      std::_Exit(1);
    }
    return 1;
  }
  char shutdown_line[96];
  std::snprintf(shutdown_line, sizeof shutdown_line, "shutting down: in-flight requests have %g s to finish",
                f.shutdown_timeout);
  log_line(LogLevel::kInfo, "serve", shutdown_line);
  (*server)->shutdown(std::chrono::milliseconds(static_cast<int64_t>(f.shutdown_timeout * 1000)));
  log_line(LogLevel::kInfo, "serve", "stopped");
  return 0;
}

}  // namespace pagoda::app
