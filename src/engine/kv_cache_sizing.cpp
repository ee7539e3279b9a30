#include "engine/kv_cache_sizing.h"

#include <algorithm>
#include <cstdio>

#include "base/memory_info.h"

namespace pagoda {
namespace {

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

}  // namespace

Result<KvCachePlan> plan_kv_cache(const WorkerMemory& m, const EngineConfig& config) {
  const SchedulerConfig& sc = config.scheduler;
  const int64_t bs = config.block_size;
  const int64_t per_block = m.block_bytes + m.draft_block_bytes * 9 / 8;
  const int64_t blocks_per_seq = (sc.max_model_len + bs - 1) / bs;
  const int64_t one_seq = blocks_per_seq * per_block;
  KvCachePlan plan;
  int64_t memory = config.kv_cache_memory;
  if (memory > 0) {
    plan.sizing = "--kv-cache-memory-bytes";
  } else if (config.gpu_memory_utilization > 0) {
    // vLLM's rule, with the machine's memory in place of the GPU's: the engine may use this
    // fraction for weights + activations + KV cache; the KV cache gets what is left.
    const double total = static_cast<double>(total_memory_bytes());
    const double share = 1.0 / std::max(1, config.replicas_on_host);
    const double allowed = config.gpu_memory_utilization * total * share;
    const double weights = static_cast<double>(m.weight_bytes);
    const double activations = static_cast<double>(m.activation_bytes);
    const double left = allowed - weights - activations;
    char fraction[32];
    std::snprintf(fraction, sizeof fraction, "%g", config.gpu_memory_utilization);
    const std::string replicas =
        config.replicas_on_host > 1 ? " / " + std::to_string(config.replicas_on_host) + " replicas on this host" : "";
    const std::string account = fraction + std::string(" of the machine's ") + gib(total) + replicas + " = " + gib(allowed) +
                                ", less " + gib(weights) + " of weights and " + gib(activations) + " of activations";
    if (left < static_cast<double>(one_seq)) {
      return invalid_argument("--gpu-memory-utilization " + std::string(fraction) + " leaves " +
                              gib(std::max(left, 0.0)) + " for the KV cache (" + account +
                              "), but one sequence of --max-model-len " + std::to_string(sc.max_model_len) + " needs " +
                              gib(static_cast<double>(one_seq)) +
                              "; raise --gpu-memory-utilization or lower --max-model-len");
    }
    memory = static_cast<int64_t>(std::min(left, 9.0e18));
    plan.sizing = "--gpu-memory-utilization " + account;
  } else {
    const double all_seqs = static_cast<double>(blocks_per_seq) * static_cast<double>(sc.max_num_seqs) *
                            static_cast<double>(per_block);
    const int replicas = std::max(1, config.replicas_on_host);
    memory = static_cast<int64_t>(std::min(all_seqs, available_memory_bytes() / 4.0 / replicas));
    plan.sizing = "default: a quarter of the available memory" +
                  (replicas > 1 ? " shared by " + std::to_string(replicas) + " replicas" : std::string()) +
                  ", at most --max-num-seqs full sequences";
  }
  plan.num_blocks = memory / per_block;
  if (plan.num_blocks < blocks_per_seq) {
    return invalid_argument("the KV cache (" + std::to_string(memory) + " bytes, " +
                            std::to_string(plan.num_blocks * bs) + " tokens) cannot hold one sequence of --max-model-len " +
                            std::to_string(sc.max_model_len) + " tokens; raise --kv-cache-memory-bytes or lower --max-model-len");
  }
  plan.num_blocks = std::min(plan.num_blocks, int64_t{1} << 30);
  return plan;
}

}  // namespace pagoda
