// How many KV cache blocks an engine gets (vLLM's KV cache sizing, the machine's memory standing
// in for the GPU's), from what its workers hold and need (worker/worker.h's WorkerMemory):
//  - --kv-cache-memory-bytes: that many bytes;
//  - --gpu-memory-utilization F: what is left of F x the machine's memory (physical, or the
//    cgroup's limit), shared by the replicas on this host, after the weights and the
//    activations of a full step;
//  - else a quarter of the memory available at start-up (shared likewise), but never more than
//    --max-num-seqs full-length sequences need.
// A block's bytes include the draft model's share (9 of its blocks per 8 of the model's).
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "engine/engine_types.h"
#include "worker/worker.h"

namespace pagoda {

struct KvCachePlan {
  int64_t num_blocks = 0;
  std::string sizing;  // how the size was chosen, for the start-up log
};

// Fails, naming the flag to change, when not even one sequence of max_model_len tokens fits.
// `config` is validated.
Result<KvCachePlan> plan_kv_cache(const WorkerMemory& memory, const EngineConfig& config);

}  // namespace pagoda
