#include "apps/pagoda/engine_flags.h"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "base/log.h"

namespace pagoda::app {

std::optional<KvCacheDtype> parse_kv_cache_dtype(const std::string& name) {
  static const std::pair<const char*, KvCacheDtype> kNames[] = {
      {"auto", KvCacheDtype::kF32},          {"float32", KvCacheDtype::kF32},   {"bfloat16", KvCacheDtype::kBF16},
      {"float16", KvCacheDtype::kF16},       {"fp8", KvCacheDtype::kFp8E4M3},   {"fp8_e4m3", KvCacheDtype::kFp8E4M3},
      {"fp8_e5m2", KvCacheDtype::kFp8E5M2},  {"int8", KvCacheDtype::kInt8},
  };
  for (const auto& [n, t] : kNames) {
    if (name == n) return t;
  }
  return std::nullopt;
}


Result<SpeculativeConfig> parse_speculative_config(const std::string& text) {
  const auto bad = [](const std::string& why) { return invalid_argument("--speculative-config: " + why); };
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return bad(std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return bad("must be a JSON object, e.g. {\"method\": \"ngram\", \"num_speculative_tokens\": 4}");
  SpeculativeConfig c;
  for (const auto& item : j.items()) {
    const std::string& key = item.key();  // not a structured binding: clang 14's lambdas cannot capture one
    const nlohmann::json& value = item.value();
    auto integer = [&](int64_t* out) -> Status {
      if (!value.is_number_integer()) return bad(key + " must be an integer");
      *out = value.get<int64_t>();
      return Status::ok_status();
    };
    Status st = Status::ok_status();
    if (key == "method") {
      if (!value.is_string()) return bad("method must be a string");
      c.method = value.get<std::string>();
      if (c.method != "ngram" && c.method != "draft_model") {
        return bad("method '" + c.method + "' is not supported (supported: ngram, draft_model)");
      }
    } else if (key == "model") {
      // vLLM's spelling: "ngram" names the method, anything else the draft model.
      if (!value.is_string() || value.get<std::string>().empty()) return bad("model must be a non-empty string");
      c.model = value.get<std::string>();
    } else if (key == "quantization") {
      if (!value.is_string()) return bad("quantization must be a string");
      c.quantization = value.get<std::string>();
    } else if (key == "num_speculative_tokens") {
      st = integer(&c.num_speculative_tokens);
    } else if (key == "prompt_lookup_max") {
      st = integer(&c.prompt_lookup_max);
    } else if (key == "prompt_lookup_min") {
      st = integer(&c.prompt_lookup_min);
    } else if (key == "disable_by_batch_size") {
      st = integer(&c.disable_by_batch_size);
    } else {
      return bad("unknown field '" + key +
                 "' (supported: method, model, quantization, num_speculative_tokens, prompt_lookup_max, prompt_lookup_min, "
                 "disable_by_batch_size)");
    }
    if (!st.ok()) return st;
  }
  if (c.model == "ngram") {
    if (!c.method.empty() && c.method != "ngram") return bad("model \"ngram\" with method '" + c.method + "'");
    c.method = "ngram";
    c.model.clear();
  } else if (!c.model.empty()) {
    if (!c.method.empty() && c.method != "draft_model") {
      return bad("method '" + c.method + "' takes no model (a draft model's method is draft_model)");
    }
    c.method = "draft_model";
  } else if (c.method == "draft_model") {
    return bad("method draft_model needs a model (the draft's path)");
  }
  if (c.method.empty()) return bad("needs a method or a model (supported: ngram, or a draft model's path)");
  if (c.method != "draft_model" && !c.quantization.empty()) return bad("quantization is for a draft model");
  if (c.method == "draft_model" && (c.prompt_lookup_max != 0 || c.prompt_lookup_min != 0)) {
    return bad("prompt_lookup_min / prompt_lookup_max are for method ngram, not a draft model");
  }
  if (c.num_speculative_tokens == 0) return bad("needs num_speculative_tokens");
  return c;
}

void EngineFlags::add_to(CLI::App& app) {
  app.add_option("--block-size", block_size, "tokens per KV cache block (1..256)")
      ->capture_default_str()
      ->group(kCacheConfig);
  app.add_option("--kv-cache-memory-bytes,--kv-cache-memory", kv_cache_memory,
                 "KV cache size in bytes, e.g. 4GiB or 4294967296; overrides --gpu-memory-utilization "
                 "(default: a quarter of the available memory, capped at what --max-num-seqs full-length "
                 "sequences need)")
      ->group(kCacheConfig);
  app.add_option("--gpu-memory-utilization", gpu_memory_utilization,
                 "fraction (0, 1] of the machine's memory the engine may use for weights + activations + KV "
                 "cache; the KV cache gets what is left (the CPU's memory stands in for the GPU's)")
      ->group(kCacheConfig);
  app.add_flag("--enable-prefix-caching,!--no-enable-prefix-caching", enable_prefix_caching,
               "automatic prefix caching (on by default; --no-enable-prefix-caching turns it off)")
      ->group(kCacheConfig);
  app.add_option("--swap-space", swap_space,
                 "accepted, no effect: there is no GPU memory to swap out of; preempted requests recompute")
      ->capture_default_str()
      ->group(kCacheConfig);
  app.add_option("--kv-cache-dtype", kv_cache_dtype,
                 "KV cache element type: auto (float32, the model's compute type), float32, bfloat16, float16, "
                 "fp8 (= fp8_e4m3), fp8_e4m3, fp8_e5m2, int8 (a scale per token and head); 2-4x the tokens in "
                 "the same memory")
      ->capture_default_str()
      ->group(kCacheConfig);

  app.add_option("--max-num-seqs", max_num_seqs, "most sequences in one step")
      ->capture_default_str()
      ->group(kSchedulerConfig);
  app.add_option("--max-num-batched-tokens", max_num_batched_tokens, "token budget of one step")
      ->capture_default_str()
      ->group(kSchedulerConfig);
  app.add_option("--long-prefill-token-threshold", long_prefill_token_threshold,
                 "most tokens one request may take in a step (0 = no cap)")
      ->capture_default_str()
      ->group(kSchedulerConfig);
  app.add_flag("--enable-chunked-prefill,!--no-enable-chunked-prefill", enable_chunked_prefill,
               "split long prompts across steps (on by default; off: a prompt runs whole in one step, which "
               "needs --max-num-batched-tokens >= --max-model-len)")
      ->group(kSchedulerConfig);
  app.add_option("--scheduling-policy", scheduling_policy, "fcfs or priority (lower first)")
      ->capture_default_str()
      ->group(kSchedulerConfig);

  app.add_option("--speculative-config", speculative_config,
                 "speculative decoding, vLLM's JSON object: {\"method\": \"ngram\", \"num_speculative_tokens\": k, "
                 "\"prompt_lookup_max\": n, \"prompt_lookup_min\": m, \"disable_by_batch_size\": b}, or with a draft "
                 "model of the same vocabulary {\"model\": PATH, \"num_speculative_tokens\": k}")
      ->group(kSpeculativeConfig);

  app.add_option("--max-model-len", max_model_len,
                 "longest prompt + output in tokens (default: the model's context length)")
      ->group(kModelConfig);
  app.add_option("--seed", seed, "seed for requests that bring none of their own")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_option("--max-logprobs", max_logprobs, "most logprobs / top_logprobs / prompt_logprobs a request may ask for")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_option("--generation-config", generation_config,
                 "request defaults: auto (the model folder's generation_config.json), vllm (the engine's own), "
                 "or a folder holding a generation_config.json")
      ->capture_default_str()
      ->group(kModelConfig);
  app.add_flag("--enforce-eager", enforce_eager, "accepted, no effect: the CPU backend captures no graphs")
      ->group(kModelConfig);
  app.add_option("--max-seq-len-to-capture", max_seq_len_to_capture,
                 "accepted, no effect: the CPU backend captures no graphs")
      ->group(kModelConfig);

  app.add_option("--tensor-parallel-size", tensor_parallel_size,
                 "tensor-parallel ranks (-tp): the model's heads, MLP and vocabulary split across processes")
      ->capture_default_str()
      ->group(kParallelConfig);
  app.add_option("--distributed-executor-backend", distributed_executor_backend,
                 "how the ranks start: mp (forked on this host, shared memory) or mpi (the ranks of mpirun); "
                 "default: mpi under mpirun, else mp")
      ->group(kParallelConfig);
  app.add_option("--cpu-affinity", cpu_affinity,
                 "the ranks' CPUs, one list per rank: 0-3|4-7 (default: VLLM_CPU_OMP_THREADS_BIND, else the "
                 "allowed cores split evenly)")
      ->group(kParallelConfig);
  app.add_option("--pipeline-parallel-size", pipeline_parallel_size,
                 "pipeline stages (-pp): the layers split across processes, several steps in flight; "
                 "tensor x pipeline ranks in all")
      ->capture_default_str()
      ->group(kParallelConfig);
  app.add_option("--data-parallel-size", data_parallel_size,
                 "data-parallel replicas (-dp) behind the one API server, each of tensor x pipeline ranks; "
                 "requests go to the least loaded (pagoda serve)")
      ->capture_default_str()
      ->group(kParallelConfig);
  app.add_option("--distributed-timeout-seconds", distributed_timeout_seconds,
                 "seconds a rank may leave the others waiting during a step before the engine fails (a hung rank)")
      ->capture_default_str()
      ->group(kParallelConfig);

  app.add_option("--log-level", log_level, "debug, info, warning, error or critical")
      ->capture_default_str()
      ->group(kPagodaGroup);
}

namespace {

Status not_yet(const std::string& flag, const std::string& value, const std::string& supported) {
  return unimplemented(flag + " " + value + " is not supported yet (supported: " + supported + ")");
}

}  // namespace

Result<EngineConfig> EngineFlags::to_config() const {
  if (tensor_parallel_size < 1 || tensor_parallel_size > 64) {
    return invalid_argument("--tensor-parallel-size must be in [1, 64], got " + std::to_string(tensor_parallel_size));
  }
  if (!distributed_executor_backend.empty() && distributed_executor_backend != "mp" &&
      distributed_executor_backend != "mpi" && distributed_executor_backend != "uni") {
    return not_yet("--distributed-executor-backend", distributed_executor_backend, "mp, mpi, uni");
  }
  if (pipeline_parallel_size < 1 || pipeline_parallel_size * tensor_parallel_size > 64) {
    return invalid_argument("--pipeline-parallel-size must be at least 1, with --tensor-parallel-size x "
                            "--pipeline-parallel-size at most 64 ranks, got " + std::to_string(pipeline_parallel_size));
  }
  if (distributed_executor_backend == "uni" && tensor_parallel_size * pipeline_parallel_size != 1) {
    return invalid_argument("--distributed-executor-backend uni runs one process: --tensor-parallel-size and "
                            "--pipeline-parallel-size must be 1");
  }
  if (data_parallel_size < 1 || data_parallel_size * pipeline_parallel_size * tensor_parallel_size > 64) {
    return invalid_argument("--data-parallel-size must be at least 1, with --data-parallel-size x "
                            "--tensor-parallel-size x --pipeline-parallel-size at most 64 ranks, got " +
                            std::to_string(data_parallel_size));
  }
  if (distributed_executor_backend == "uni" && data_parallel_size != 1) {
    return invalid_argument("--distributed-executor-backend uni runs one process: --data-parallel-size must be 1");
  }
  if (!(distributed_timeout_seconds > 0 && distributed_timeout_seconds <= 86400)) {
    return invalid_argument("--distributed-timeout-seconds must be in (0, 86400], got " +
                            std::to_string(distributed_timeout_seconds));
  }
  const std::optional<KvCacheDtype> cache_dtype = parse_kv_cache_dtype(kv_cache_dtype);
  if (!cache_dtype) {
    return not_yet("--kv-cache-dtype", kv_cache_dtype,
                   "auto, float32, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, int8");
  }
  if (!parse_log_level(log_level)) {
    return invalid_argument("--log-level must be debug, info, warning, error or critical, got '" + log_level + "'");
  }
  if (!(swap_space >= 0)) return invalid_argument("--swap-space must be >= 0");
  if (max_logprobs < 0) return invalid_argument("--max-logprobs must be >= 0");
  if (generation_config.empty()) return invalid_argument("--generation-config must be auto, vllm or a folder");

  EngineConfig c;
  c.block_size = block_size;
  c.kv_cache_dtype = *cache_dtype;
  if (!kv_cache_memory.empty()) {
    auto bytes = parse_byte_size(kv_cache_memory);
    if (!bytes.ok()) return invalid_argument("--kv-cache-memory-bytes: " + bytes.status().message());
    c.kv_cache_memory = *bytes;
  }
  if (gpu_memory_utilization) {
    if (!(*gpu_memory_utilization > 0 && *gpu_memory_utilization <= 1)) {
      return invalid_argument("--gpu-memory-utilization must be in (0, 1], got " + std::to_string(*gpu_memory_utilization));
    }
    c.gpu_memory_utilization = *gpu_memory_utilization;
  }
  c.scheduler.max_num_seqs = max_num_seqs;
  c.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  c.scheduler.max_model_len = max_model_len;
  c.scheduler.long_prefill_token_threshold = long_prefill_token_threshold;
  c.scheduler.enable_chunked_prefill = enable_chunked_prefill;
  if (scheduling_policy == "fcfs") {
    c.scheduler.policy = SchedulingPolicy::kFcfs;
  } else if (scheduling_policy == "priority") {
    c.scheduler.policy = SchedulingPolicy::kPriority;
  } else {
    return invalid_argument("--scheduling-policy must be fcfs or priority, got '" + scheduling_policy + "'");
  }
  c.enable_prefix_caching = enable_prefix_caching;
  if (!speculative_config.empty()) {
    PAGODA_ASSIGN_OR_RETURN(c.speculative, parse_speculative_config(speculative_config));
    if (c.speculative.method == "draft_model" && data_parallel_size > 1) {
      return not_yet("--speculative-config", "draft_model with --data-parallel-size > 1", "ngram there");
    }
  }
  c.seed = seed;
  c.max_logprobs = max_logprobs;
  return c;
}

Status EngineFlags::check_one_replica(const std::string& command) const {
  PAGODA_RETURN_IF_ERROR(to_config().status());  // a bad value is named as such first
  if (data_parallel_size == 1) return Status::ok_status();
  return invalid_argument("--data-parallel-size " + std::to_string(data_parallel_size) + ": " + command +
                          " runs one engine; data-parallel replicas serve behind `pagoda serve`");
}

std::vector<std::string> rewrite_vllm_short_options(int argc, char** argv) {
  static const std::pair<const char*, const char*> kLong[] = {
      {"-tp", "--tensor-parallel-size"}, {"-pp", "--pipeline-parallel-size"}, {"-dp", "--data-parallel-size"},
      {"-sc", "--speculative-config"}};
  std::vector<std::string> out;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    for (const auto& [short_name, long_name] : kLong) {
      const std::string s = short_name;
      if (arg == s) {
        arg = long_name;
      } else if (arg.rfind(s + "=", 0) == 0) {
        arg = std::string(long_name) + arg.substr(s.size());
      }
    }
    out.push_back(std::move(arg));
  }
  return out;
}

}  // namespace pagoda::app
