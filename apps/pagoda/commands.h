// The subcommands of the pagoda binary. Each returns the process exit status and prints errors
// as one line on stderr.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "launch/cli_flags.h"
#include "launch/engine_flags.h"
#include "launch/model_loading.h"
#include "tools/quantize/quantize.h"

namespace pagoda::app {

int fail(const Status& status);

struct GenerateFlags {
  ModelFlags model;
  EngineFlags engine;
  std::string prompt;
  std::string input_file;   // JSONL batch mode
  std::string output_file;  // default: stdout
  int64_t max_tokens = 16;
  // Sampling flags: absent ones take --generation-config's defaults, else the engine's (1, 1, 0, 0).
  std::optional<double> temperature;
  std::optional<double> top_p;
  std::optional<int64_t> top_k;
  std::optional<double> min_p;
  std::optional<uint64_t> request_seed;
  bool ignore_eos = false;
  bool no_add_special = false;
  bool verbose = false;
};
int run_generate(const GenerateFlags& flags);

// `pagoda perplexity` (perplexity_cmd.cpp).
struct PerplexityFlags {
  ModelFlags model;
  std::string text_file;
  int64_t ctx = 512;
  int64_t chunks = 0;  // 0: every whole chunk of the text
  int64_t batch_size = 512;
  std::string save_logits;  // base run: write the log-probabilities here
  std::string kl_base;      // compare with a --save-logits file
  std::string kv_cache_dtype = "auto";
  std::string output_json;
};
int run_perplexity(const PerplexityFlags& flags);

// `pagoda quantize` (quantize_cmd.cpp): the tools library's options (tools/quantize/quantize.h).
using QuantizeFlags = QuantizeOptions;
int run_quantize(const QuantizeFlags& flags);

struct BenchThroughputFlags {
  ModelFlags model;
  EngineFlags engine;
  int64_t input_len = 128;
  int64_t output_len = 128;
  int64_t num_prompts = 16;
  uint64_t dataset_seed = 0;
  std::string dataset_name = "random";  // random, or copy (a passage repeated: see bench_cmd.cpp)
  double temperature = 1.0;
  std::string dataset_path;  // JSONL prompts instead of random ones
  std::string output_json;  // optional machine-readable result
};
int run_bench_throughput(const BenchThroughputFlags& flags);

// `pagoda bench latency`: one batch, end to end, several times (vLLM's `vllm bench latency`).
struct BenchLatencyFlags {
  ModelFlags model;
  EngineFlags engine;
  int64_t batch_size = 8;
  int64_t input_len = 32;
  int64_t output_len = 128;
  int64_t num_iters_warmup = 3;
  int64_t num_iters = 10;
  uint64_t dataset_seed = 0;
  std::string dataset_name = "random";
  double temperature = 1.0;
  std::string output_json;
};
int run_bench_latency(const BenchLatencyFlags& flags);

// `pagoda bench roofline`: the machine's bandwidth and peak rates, and the ceilings they imply.
struct BenchRooflineFlags {
  int64_t threads = 0;            // 0 = one per physical core
  std::string buffer = "1GiB";    // the bandwidth test's buffer
  double seconds = 0.5;           // per arithmetic test and repetition
  std::string output_json;
};
int run_bench_roofline(const BenchRooflineFlags& flags);

// `pagoda bench sweep`: bench throughput or bench serve over a grid of one or two flags.
struct BenchSweepFlags {
  std::string mode = "throughput";  // or serve
  std::vector<std::string> params;  // NAME=V1,V2,...
  std::string model_args;           // space-separated
  std::string bench_args;
  std::string latency_goal;         // e.g. p99_ttft:500
  std::string output_csv = "sweep.csv";
  std::string output_svg = "sweep.svg";
  std::string work_dir = "sweep";

  void add_to(CLI::App& cmd);
};
int run_bench_sweep(const BenchSweepFlags& flags);

// `pagoda bench serve`: vLLM's flag names and defaults.
struct BenchServeFlags {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";
  std::string model;
  std::string api_key;
  std::string dataset_name = "random";
  std::string dataset_path;
  int64_t random_input_len = 1024;
  int64_t random_output_len = 128;
  double random_range_ratio = 0.0;
  int64_t random_prefix_len = 0;
  int64_t num_prompts = 1000;
  std::string request_rate = "inf";
  double burstiness = 1.0;
  int64_t max_concurrency = 0;
  bool ignore_eos = false;
  uint64_t seed = 0;
  std::vector<std::string> goodput;
  std::string percentile_metrics = "ttft,tpot,itl";
  std::string metric_percentiles = "99";
  std::string save_result;
  bool disable_progress = false;

  void add_to(CLI::App& cmd);
};
int run_bench_serve(const BenchServeFlags& flags);

struct ServeFlags {
  std::string positional_model;  // `pagoda serve MODEL`
  ModelFlags model;
  EngineFlags engine;
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  std::vector<std::string> served_model_names;
  std::string api_key;
  bool metrics_no_auth = false;
  std::string chat_template;
  bool disable_log_requests = false;
  bool enable_log_requests = false;
  std::string uvicorn_log_level = "info";
  bool disable_log_stats = false;
  int64_t max_queued_requests = 0;
  double shutdown_timeout = 0;  // seconds
  std::string max_request_body = "32MiB";
  double http_header_timeout = 30;  // seconds
  double http_write_timeout = 30;   // seconds
  std::string max_unsent_stream = "4MiB";
  double health_stall_timeout = 60;  // seconds
  std::string fault_injection;       // tests only: "throw-at-step:N", "stall-at-step:N[:SECONDS]"
  std::string structured_outputs_config;  // vLLM's JSON, e.g. {"disable_any_whitespace": true}
  std::string reasoning_parser;           // qwen3, deepseek_r1
  std::string tool_call_parser;           // hermes, llama3_json, mistral, pythonic
  bool enable_auto_tool_choice = false;

  void add_to(CLI::App& cmd);
};
int run_serve(ServeFlags flags);

// `pagoda proxy`: the front of a disaggregated deployment (server/disagg_proxy.h).
struct ProxyFlags {
  std::vector<std::string> prefill;  // URLs (also comma-separated)
  std::vector<std::string> decode;
  std::string host = "127.0.0.1";
  uint16_t port = 8000;
  double timeout = 600;  // seconds one read from an instance may wait

  void add_to(CLI::App& cmd);
};
int run_proxy(const ProxyFlags& flags);

}  // namespace pagoda::app
