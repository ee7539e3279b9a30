// The engine flags every serving subcommand accepts alike (serve, generate, bench), named as
// vLLM names them and shown in `--help` under vLLM's config groups. Flags that name a capability
// Pagoda does not have yet fail in to_config() with one line naming the flag, the value and what
// is supported; flags with no meaning on a CPU engine are accepted and documented as such
// (docs/configuration.md has the whole `vllm serve` table).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/engine_core.h"

namespace pagoda::app {

// A --kv-cache-dtype value (vLLM's names, plus float32 and int8): nullopt for any other.
std::optional<KvCacheDtype> parse_kv_cache_dtype(const std::string& name);

// A --speculative-config value: vLLM's JSON object, e.g. {"method": "ngram",
// "num_speculative_tokens": 4, "prompt_lookup_max": 4}. `model: "ngram"` also selects n-gram
// (as in vLLM). Fails, naming the field, on malformed JSON, a field of the wrong type, a method
// Pagoda does not run (draft_model, eagle, mtp, ...) or a field it does not know. Ranges are
// checked by EngineCore::create.
Result<SpeculativeConfig> parse_speculative_config(const std::string& json);

struct EngineFlags {
  // CacheConfig
  int32_t block_size = 16;
  std::string kv_cache_memory;              // --kv-cache-memory-bytes; "" = not set
  std::optional<double> gpu_memory_utilization;
  bool enable_prefix_caching = true;
  double swap_space = 4;                    // GiB; accepted, no effect
  std::string kv_cache_dtype = "auto";
  // SchedulerConfig
  int64_t max_num_seqs = 256;
  int64_t max_num_batched_tokens = 2048;
  int64_t long_prefill_token_threshold = 0;
  bool enable_chunked_prefill = true;
  std::string scheduling_policy = "fcfs";
  // SpeculativeConfig
  std::string speculative_config;           // JSON; "" = no speculation
  // KVTransferConfig
  std::string kv_transfer_config;           // JSON; "" = no KV connector
  std::optional<double> kv_offloading_size; // GiB of host tier (the OffloadingConnector)
  std::string kv_offloading_backend = "native";
  // ModelConfig
  int64_t max_model_len = 0;                // 0 = the model's context length
  uint64_t seed = 0;
  int64_t max_logprobs = SamplingParams::kMaxLogprobs;
  std::string generation_config = "auto";
  bool enforce_eager = false;               // accepted, no effect
  int64_t max_seq_len_to_capture = 8192;    // accepted, no effect
  // ParallelConfig
  int64_t tensor_parallel_size = 1;
  int64_t pipeline_parallel_size = 1;
  int64_t data_parallel_size = 1;
  std::string distributed_executor_backend;  // "" = mpi under mpirun, else mp (apps/pagoda/ranks.h)
  std::string cpu_affinity;                  // the ranks' CPUs, "0-3|4-7"; "" = VLLM_CPU_OMP_THREADS_BIND or auto
  double distributed_timeout_seconds = 30;   // how long a wait for another rank may last during steps
  // Pagoda's
  std::string log_level = "info";

  // The engine configuration; fails on a value Pagoda does not support (yet).
  Result<EngineConfig> to_config() const;
  // Fails, naming `command`, when the flags ask for data-parallel replicas (only the server has them).
  Status check_one_replica(const std::string& command) const;
};


}  // namespace pagoda::app
