#include "launch/engine_flags.h"

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
    // Not 0: that means "not set" in the config.
    if (*gpu_memory_utilization == 0) return invalid_argument("--gpu-memory-utilization must be in (0, 1], got 0");
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
  }
  if (kv_offloading_backend != "native") return not_yet("--kv-offloading-backend", kv_offloading_backend, "native");
  if (!kv_transfer_config.empty() && kv_offloading_size) {
    return invalid_argument("--kv-offloading-size and --kv-transfer-config both name a KV connector: give one");
  }
  if (!kv_transfer_config.empty()) {
    PAGODA_ASSIGN_OR_RETURN(c.kv_transfer, KvTransferConfig::parse(kv_transfer_config));
  } else if (kv_offloading_size) {
    PAGODA_ASSIGN_OR_RETURN(c.kv_transfer, KvTransferConfig::offloading(*kv_offloading_size));
  }
  c.seed = seed;
  c.max_logprobs = max_logprobs;
  PAGODA_RETURN_IF_ERROR(c.validate());  // what needs no model, before anything loads
  return c;
}

Status EngineFlags::check_one_replica(const std::string& command) const {
  PAGODA_RETURN_IF_ERROR(to_config().status());  // a bad value is named as such first
  if (data_parallel_size == 1) return Status::ok_status();
  return invalid_argument("--data-parallel-size " + std::to_string(data_parallel_size) + ": " + command +
                          " runs one engine; data-parallel replicas serve behind `pagoda serve`");
}

}  // namespace pagoda::app
