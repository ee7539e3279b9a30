// MultiConnector (vLLM's name): several KV connectors as one, e.g. a decode instance that loads
// prompts from prefill instances (TcpConnector) and keeps evicted blocks in a host tier
// (OffloadingConnector). A request loads from the part that has the most of its tokens; every part
// sees every scheduled request (each saves what it saves); their moves travel in one
// KvConnectorMetadata, whose fields the parts do not share, and each request's load is reported
// by the part that runs it. Engine (or worker) thread only.
#pragma once

#include <memory>
#include <unordered_map>
#include <vector>

#include "kv_transfer/kv_connector.h"

namespace pagoda {

class MultiScheduler final : public KvConnectorScheduler {
 public:
  explicit MultiScheduler(std::vector<std::unique_ptr<KvConnectorScheduler>> parts);

  int64_t get_num_new_matched_tokens(const KvRequest& request, int64_t num_local_computed) override;
  void update_state_after_alloc(const KvRequest& request, std::span<const BlockId> blocks, int64_t num_local_computed,
                                int64_t num_external) override;
  void on_scheduled(const KvRequest& request, int64_t num_computed_after, std::span<const BlockId> blocks) override;
  KvConnectorMetadata build_meta() override;
  void update_connector_output(const KvConnectorMetadata& meta, const KvConnectorOutput& output,
                               std::vector<RequestId>& done, std::vector<RequestId>& failed) override;
  void request_finished(const KvRequest& request) override;
  KvConnectorStats stats() const override;

 private:
  std::vector<std::unique_ptr<KvConnectorScheduler>> parts_;
  std::unordered_map<RequestId, size_t> chosen_;  // the part that answered get_num_new_matched_tokens
  std::vector<KvConnectorMetadata> last_;         // each part's metadata of the step built last
};

class MultiWorker final : public KvConnectorWorker {
 public:
  explicit MultiWorker(std::vector<std::unique_ptr<KvConnectorWorker>> parts);

  Status register_kv_caches(const KvCacheTensors& kv, const Kernels& kernels) override;
  void start_step(const KvConnectorMetadata& meta, bool idle) override;
  KvConnectorOutput finish_step(const KvConnectorMetadata& meta) override;

 private:
  std::vector<std::unique_ptr<KvConnectorWorker>> parts_;
  std::unordered_map<RequestId, size_t> owner_;  // which part runs each awaited load
};

}  // namespace pagoda
