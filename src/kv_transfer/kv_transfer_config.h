// KvTransferConfig: vLLM's --kv-transfer-config (a JSON object) and --kv-offloading-size, read
// once by the launch code and passed down: which KV connector the engine runs and how.
//
// Connectors (the kv_connector field):
//   TcpConnector, ShmConnector: disaggregated prefill (kv_transfer/remote_connector.h); kv_role
//     kv_producer (a prefill instance: keeps prompts' blocks, serves them on kv_ip:kv_port + its
//     rank, in at most kv_buffer_size bytes), kv_consumer (a decode instance: loads them), kv_both.
//   MultiConnector: several of the above (kv_connector_extra_config.connectors, a list of such
//     objects; at most one OffloadingConnector and one TcpConnector / ShmConnector): a request
//     loads from the first that has its tokens, and every part saves what it saves.
//   OffloadingConnector: a tier of evicted prefix blocks in host memory beyond the KV cache
//     (kv_connector_extra_config: "cpu_bytes_to_use" or "num_cpu_blocks"), optionally backed by
//     a directory on disk that persists across restarts ("disk_path", "disk_bytes_to_use").
// Plain values.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace pagoda {

struct KvTransferConfig {
  std::string kv_connector;          // "" = none
  std::string kv_role = "kv_both";   // kv_producer, kv_consumer or kv_both
  std::string engine_id;
  std::string kv_ip = "127.0.0.1";
  int kv_port = 14579;
  int64_t kv_buffer_size = 1000000000;  // bytes
  // A decode instance's prefill instances ("host:kv_port"), from kv_connector_extra_config
  // "prefill_peers": kv_transfer_params naming any other are not used. Empty: any.
  std::vector<std::string> prefill_peers;
  // OffloadingConnector
  int64_t cpu_bytes_to_use = 0;      // the host tier's size (0 with num_cpu_blocks)
  int64_t num_cpu_blocks = 0;        // or its size in blocks
  std::string disk_path;             // "" = no disk tier
  int64_t disk_bytes_to_use = 0;     // the disk tier's size; 0 = 10 times the host tier's
  std::vector<KvTransferConfig> connectors;  // MultiConnector's parts, in order

  bool enabled() const { return !kv_connector.empty(); }
  // The connector (this one, or a part of a MultiConnector) that keeps tiers / that transfers
  // between instances (TcpConnector, ShmConnector); null when there is none.
  const KvTransferConfig* offloading_part() const;
  const KvTransferConfig* remote_part() const;
  bool offloading() const { return offloading_part() != nullptr; }
  bool remote() const { return remote_part() != nullptr; }
  // Which way the transfer goes.
  bool producer() const {
    const KvTransferConfig* r = remote_part();
    return r != nullptr && (r->kv_role == "kv_producer" || r->kv_role == "kv_both");
  }
  bool consumer() const {
    const KvTransferConfig* r = remote_part();
    return r != nullptr && (r->kv_role == "kv_consumer" || r->kv_role == "kv_both");
  }

  // Parses vLLM's JSON. Fails naming the field for an unknown connector or role, a field of the
  // wrong type, or a connector's missing or bad extra config.
  static Result<KvTransferConfig> parse(const std::string& json_text);
  // --kv-offloading-size GIB: the OffloadingConnector with a host tier of that many GiB.
  static Result<KvTransferConfig> offloading(double gib);
  // "OffloadingConnector (host tier 2.00 GiB, disk /var/cache/pagoda-kv up to 20.00 GiB)"
  std::string describe() const;
};

// What a worker needs to run its side of the connector (sent in WorkerInit).
struct KvConnectorWorkerConfig {
  std::string connector;                // "" = none
  int64_t num_host_slots = 0;           // host-tier slots, one block each
  std::string disk_path;                // "" = no disk tier
  std::array<uint8_t, 32> fingerprint{};  // the model and KV layout the blocks belong to
  // TcpConnector / ShmConnector (a MultiConnector's transfer part names itself here)
  std::string remote_connector;
  std::string kv_role;
  int32_t tp_size = 1;                  // this instance's tensor-parallel ranks
  std::string engine_id;
  std::string kv_ip;
  int32_t kv_port = 0;
  int64_t kv_buffer_size = 0;
  std::array<uint8_t, 32> transfer_fingerprint{};  // what both ends of a transfer must agree on
  std::string transfer_description;     // the same in words, for a refusal's message

  bool operator==(const KvConnectorWorkerConfig&) const = default;
};

}  // namespace pagoda
