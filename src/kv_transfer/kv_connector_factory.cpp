#include "kv_transfer/kv_connector_factory.h"

#include <cstdio>

#include "kv_transfer/multi_connector.h"
#include "kv_transfer/offloading_connector.h"
#include "kv_transfer/remote_connector.h"
#include "model/kv_cache.h"
#include "model/tensor_parallel.h"

namespace pagoda {
namespace {

// "1.50 GiB", "12.3 MiB".
std::string size_text(int64_t bytes) {
  char text[32];
  if (bytes >= (int64_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else {
    std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  }
  return text;
}

std::string shard_tag(int rank, int size) { return "r" + std::to_string(rank) + "of" + std::to_string(size); }

}  // namespace

Result<std::unique_ptr<KvConnectorWorker>> make_kv_connector_worker(const KvConnectorWorkerConfig& config, int rank,
                                                                    int size, const KvCacheTensors& kv,
                                                                    int64_t total_kv_heads) {
  if (config.connector == "MultiConnector") {
    // Its configuration carries both parts' fields: the tiers first, the transfers last (the
    // order MultiWorker relies on).
    std::vector<std::unique_ptr<KvConnectorWorker>> parts;
    for (const std::string& name : {std::string("OffloadingConnector"), config.remote_connector}) {
      if (name.empty() || (name == "OffloadingConnector" && config.num_host_slots == 0)) continue;
      KvConnectorWorkerConfig part = config;
      part.connector = name;
      PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<KvConnectorWorker> w,
                              make_kv_connector_worker(part, rank, size, kv, total_kv_heads));
      parts.push_back(std::move(w));
    }
    return std::unique_ptr<KvConnectorWorker>(std::make_unique<MultiWorker>(std::move(parts)));
  }
  if (config.connector == "TcpConnector" || config.connector == "ShmConnector") {
    const IndexRange heads = kv_head_range(total_kv_heads, rank, size);
    if (heads.size() != kv.num_kv_heads()) {
      return internal_error("KV transfer: rank " + std::to_string(rank) + " holds " + std::to_string(kv.num_kv_heads()) +
                            " KV heads, the split says " + std::to_string(heads.size()));
    }
    const KvBlockLayout shard{kv.num_layers(), kv.block_size(), heads.begin, heads.end, kv.head_dim(), kv.dtype()};
    return std::unique_ptr<KvConnectorWorker>(std::make_unique<RemoteWorker>(config, shard, total_kv_heads, rank));
  }
  if (config.connector == "OffloadingConnector") {
    return std::unique_ptr<KvConnectorWorker>(std::make_unique<OffloadingWorker>(config, shard_tag(rank, size)));
  }
  return invalid_argument("unknown KV connector '" + config.connector + "'");
}

Result<KvConnectorPlan> make_kv_connector(const KvTransferConfig& config, const KvConnectorSetup& setup) {
  if (!config.connectors.empty()) {
    // A MultiConnector: each part's plan, the scheduler sides together, the worker fields merged.
    std::vector<std::unique_ptr<KvConnectorScheduler>> schedulers;
    KvConnectorPlan plan;
    for (const KvTransferConfig* part : {config.offloading_part(), config.remote_part()}) {
      if (part == nullptr) continue;
      PAGODA_ASSIGN_OR_RETURN(KvConnectorPlan p, make_kv_connector(*part, setup));
      schedulers.push_back(std::move(p.scheduler));
      KvConnectorWorkerConfig& w = plan.worker;
      if (part->offloading()) {
        w.num_host_slots = p.worker.num_host_slots;
        w.disk_path = p.worker.disk_path;
        w.fingerprint = p.worker.fingerprint;
      } else {
        const int64_t slots = w.num_host_slots;
        const std::string disk = w.disk_path;
        const auto fingerprint = w.fingerprint;
        w = p.worker;
        w.remote_connector = p.worker.connector;
        w.num_host_slots = slots;
        w.disk_path = disk;
        w.fingerprint = fingerprint;
      }
      plan.summary += (plan.summary.empty() ? "" : "; ") + p.summary;
    }
    plan.worker.connector = "MultiConnector";
    plan.scheduler = std::make_unique<MultiScheduler>(std::move(schedulers));
    return plan;
  }
  if (config.remote()) {
    KvConnectorPlan plan;
    plan.scheduler =
        std::make_unique<RemoteScheduler>(setup.block_size, config.producer(), config.consumer(), config.prefill_peers);
    KvConnectorWorkerConfig& w = plan.worker;
    w.connector = config.kv_connector;
    w.kv_role = config.kv_role;
    w.tp_size = setup.tensor_parallel_size;
    w.engine_id = config.engine_id;
    w.kv_ip = config.kv_ip;
    w.kv_port = config.kv_port;
    w.kv_buffer_size = config.kv_buffer_size;
    w.transfer_fingerprint = setup.transfer_fingerprint;
    w.transfer_description = setup.transfer_description;
    plan.summary = "KV transfer: " + config.describe() +
                   (config.producer() ? ", prompts kept in up to " + size_text(config.kv_buffer_size) + " per rank" : "");
    return plan;
  }
  if (!config.offloading()) return invalid_argument("--kv-transfer-config: unknown KV connector '" + config.kv_connector + "'");
  if (setup.block_bytes <= 0) return internal_error("a KV block of no bytes");
  const int64_t slots = config.num_cpu_blocks > 0 ? config.num_cpu_blocks : config.cpu_bytes_to_use / setup.block_bytes;
  if (slots < 1) {
    return invalid_argument("--kv-offloading-size: the host tier must hold at least one KV block of " +
                            std::to_string(setup.block_bytes) + " bytes");
  }
  OffloadingSchedulerConfig sc;
  sc.block_size = setup.block_size;
  sc.num_host_slots = slots;
  sc.fingerprint = setup.fingerprint;
  KvConnectorPlan plan;
  plan.worker.connector = config.kv_connector;
  plan.worker.num_host_slots = slots;
  plan.worker.fingerprint = setup.fingerprint;
  plan.summary = "KV offloading: a host tier of " + std::to_string(slots) + " blocks (" +
                 size_text(slots * setup.block_bytes) + ")";
  if (!config.disk_path.empty()) {
    // Rank 0's files say what the disk tier holds (every rank writes its own shard of a block).
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<KvDiskStore> store,
                            KvDiskStore::open(config.disk_path, setup.fingerprint, shard_tag(0, setup.tensor_parallel_size),
                                              setup.block_bytes));
    const int64_t disk_bytes = config.disk_bytes_to_use > 0 ? config.disk_bytes_to_use : 10 * slots * setup.block_bytes;
    sc.disk = true;
    sc.disk_capacity_blocks = disk_bytes / store->file_bytes();
    if (sc.disk_capacity_blocks < 1) {
      return invalid_argument("--kv-transfer-config: disk_bytes_to_use must hold at least one KV block file of " +
                              std::to_string(store->file_bytes()) + " bytes");
    }
    sc.disk_keys = store->scan();
    plan.worker.disk_path = config.disk_path;
    plan.summary += ", a disk tier in " + config.disk_path + " of " + std::to_string(sc.disk_capacity_blocks) +
                    " blocks (" + size_text(disk_bytes) + ", " + std::to_string(sc.disk_keys.size()) + " found)";
  }
  plan.scheduler = std::make_unique<OffloadingScheduler>(std::move(sc));
  return plan;
}

}  // namespace pagoda
