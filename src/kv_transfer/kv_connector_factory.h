// Making a KV connector's halves from the configuration: the scheduler side on the engine's rank,
// the worker side on every rank (the names are vLLM's kv_connector values).
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "kv_transfer/kv_connector.h"
#include "kv_transfer/kv_transfer_config.h"

namespace pagoda {

class KvCacheTensors;

// The worker side of `config.connector` for tensor-parallel rank `rank` of `size`, whose KV cache
// `kv` holds its shard of a model of `total_kv_heads`; fails naming an unknown connector.
Result<std::unique_ptr<KvConnectorWorker>> make_kv_connector_worker(const KvConnectorWorkerConfig& config, int rank,
                                                                    int size, const KvCacheTensors& kv,
                                                                    int64_t total_kv_heads);

// What the engine knows when it makes the scheduler side.
struct KvConnectorSetup {
  int64_t block_size = 16;
  int64_t block_bytes = 0;     // one block of rank 0's shard (a host-tier slot)
  int tensor_parallel_size = 1;
  std::array<uint8_t, 32> fingerprint{};  // the model and KV layout (EngineCore computes it)
  // What both ends of a transfer must share (remote_connector.h's transfer_fingerprint), and the
  // same in words for a refusal.
  std::array<uint8_t, 32> transfer_fingerprint{};
  std::string transfer_description;
};

// The scheduler side of `config`, and the worker side's configuration to send every worker.
// Fails naming the problem: a host tier smaller than one block, a disk tier's directory that
// cannot be opened.
struct KvConnectorPlan {
  std::unique_ptr<KvConnectorScheduler> scheduler;
  KvConnectorWorkerConfig worker;
  std::string summary;  // for the start-up log
};
Result<KvConnectorPlan> make_kv_connector(const KvTransferConfig& config, const KvConnectorSetup& setup);

}  // namespace pagoda
