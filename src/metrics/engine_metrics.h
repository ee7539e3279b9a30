// EngineMetrics: the engine's Prometheus metric set, with vLLM v1's names, types and default
// buckets, so dashboards, autoscalers and routers written for vLLM read Pagoda unchanged.
//
// The engine loops call record_*() (from one thread, or several: every method is thread-safe);
// the HTTP /metrics route calls render(). Every series carries the labels model_name and engine
// (the data-parallel replica's index, "0" with one engine, as vLLM exports it);
// vllm:request_success adds finished_reason. Sums over the replicas are PromQL's
// (sum without (engine) (...)); snapshot() sums them for the periodic log line.
//
// Buckets (from vllm/v1/metrics/loggers.py):
//   time_to_first_token_seconds   0.001 ... 2560
//   inter_token_latency_seconds   0.01 ... 80
//   e2e_request_latency_seconds,
//   request_queue_time_seconds    0.3 ... 7680
//   request_prompt_tokens,
//   request_generation_tokens     1-2-5 series up to max_model_len (1, 2, 5, 10, 20, 50, ...)
//   iteration_tokens_total        1, 8, 16, 32, ..., 16384
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "metrics/registry.h"

namespace pagoda::metrics {

// The KV-cache settings exported as labels of vllm:cache_config_info (value 1).
struct CacheConfigInfo {
  int64_t block_size = 0;
  int64_t num_blocks = 0;  // exported as num_gpu_blocks, vLLM's name
  bool enable_prefix_caching = false;
  std::string cache_dtype = "auto";
  bool kv_offload = false;   // a KV connector with tiers runs: export the vllm:kv_offload_* series
  bool kv_transfer = false;  // one that moves KV between instances: the vllm:kv_transfer_* series
};

// A KV connector's running totals (kv_transfer/kv_connector.h's KvConnectorStats), for the
// vllm:external_prefix_cache_* and vllm:kv_offload_* series. Token counts for queries and hits,
// blocks and bytes of rank 0's shard for the moves.
struct KvOffloadTotals {
  int64_t queries = 0, hits = 0, disk_hits = 0, failed_loads = 0;
  int64_t stored_blocks = 0, stored_bytes = 0;
  int64_t loaded_blocks = 0, loaded_bytes = 0;            // from either tier
  int64_t disk_loaded_blocks = 0, disk_loaded_bytes = 0;  // of those, from disk
  int64_t disk_written_blocks = 0, disk_written_bytes = 0;
  double load_seconds = 0, store_seconds = 0;
  int64_t host_blocks = 0, host_capacity = 0, disk_blocks = 0, disk_capacity = 0;  // gauges
  // Between instances (disaggregated prefill).
  int64_t remote_queries = 0, remote_hits = 0;  // tokens asked of prefill instances, and received
  int64_t staged_blocks = 0, staged_bytes = 0, sent_blocks = 0, sent_bytes = 0, received_blocks = 0, received_bytes = 0, failed_transfers = 0;
  double transfer_seconds = 0;
};

// vLLM's default bucket layouts, exposed for tests and for other components.
std::vector<double> ttft_buckets();
std::vector<double> inter_token_latency_buckets();
std::vector<double> request_latency_buckets();
std::vector<double> iteration_tokens_buckets();
// 1, 2, 5, 10, 20, 50, ... while <= max_value (vLLM's build_1_2_5_buckets). max_value >= 1.
std::vector<double> buckets_1_2_5(int64_t max_value);

class EngineMetrics {
 public:
  // `max_model_len` bounds the token-count histograms' buckets; `num_engines` data-parallel
  // replicas each get their series (engine="0" ... "num_engines - 1"); the record_*() methods'
  // `engine` says whose.
  EngineMetrics(std::string model_name, const CacheConfigInfo& cache, int64_t max_model_len, int num_engines = 1);
  EngineMetrics(const EngineMetrics&) = delete;
  EngineMetrics& operator=(const EngineMetrics&) = delete;

  int num_engines() const { return static_cast<int>(engines_.size()); }

  // Once per engine step. Gauges are set; the *_total arguments are running totals kept by the
  // KV manager / scheduler, and only their increase since the previous call is added to the
  // counters. A total smaller than the previous one means its source was reset: the new total
  // is then counted as the increase (the counter itself never goes down). iteration_tokens is
  // the number of tokens scheduled this step (observed into vllm:iteration_tokens_total when > 0).
  void record_step(int64_t num_running, int64_t num_waiting, double kv_usage, uint64_t prefix_queries_total,
                   uint64_t prefix_hits_total, uint64_t preemptions_total, int64_t iteration_tokens, int engine = 0);

  // Once per finished request: reason is "stop", "length", "abort", "error", ...;
  // times in seconds (queue: queued -> first scheduled, ttft: arrival -> first token,
  // e2e: arrival -> last token).
  void record_finished(std::string_view reason, int64_t prompt_tokens, int64_t generation_tokens, double queue_s,
                       double ttft_s, double e2e_s, int engine = 0);

  // The gap between two successive outputs of one request.
  void record_inter_token(double seconds, int engine = 0);

  // Tokens processed: prompt (prefill) and generated, added to the token counters.
  void record_tokens(int64_t prompt, int64_t generation, int engine = 0);

  // A request's prompt tokens by where their KV came from, once, at its first token:
  // vllm:prompt_tokens_by_source{source="local_compute" | "local_cache_hit" | "external_kv_transfer"}.
  void record_prompt_sources(int64_t computed, int64_t cache_hit, int64_t external, int engine = 0);

  // Once per engine step with a KV connector (CacheConfigInfo::kv_offload / kv_transfer): counters grow by the
  // totals' increase since the last call, gauges are set. Series (counters render with _total):
  //   vllm:external_prefix_cache_queries / _hits      tokens looked up in / loaded from the tiers
  //   vllm:kv_offload_hit_tokens{tier}                 loaded tokens by tier (host, disk)
  //   vllm:kv_offload_failed_loads                     loads that failed (the tokens were computed)
  //   vllm:kv_offload_stored_blocks / _stored_bytes    saved from the KV cache into the host tier
  //   vllm:kv_offload_loaded_blocks{tier} / _loaded_bytes{tier}
  //   vllm:kv_offload_disk_written_blocks / _disk_written_bytes
  //   vllm:kv_offload_seconds{direction}               copy time, load and store
  //   vllm:kv_offload_blocks{tier}, vllm:kv_offload_capacity_blocks{tier}   (gauges)
  // and between instances:
  //   vllm:kv_transfer_received_tokens / _received_blocks / _received_bytes   into this decode instance
  //   vllm:kv_transfer_staged_blocks / _staged_bytes                         kept by this prefill instance
  //   vllm:kv_transfer_sent_blocks / _sent_bytes                             served by it (counted at its next step)
  //   vllm:kv_transfer_failed / vllm:kv_transfer_seconds                     receives that failed, their time
  void record_kv_offload(const KvOffloadTotals& totals, int engine = 0);

  // One request's drafts verified in a step (speculative decoding): num_draft_tokens scheduled,
  // the first num_accepted of them accepted. Adds to vllm:spec_decode_num_drafts (1),
  // _num_draft_tokens, _num_accepted_tokens and _num_accepted_tokens_per_pos{position=i} for
  // i < num_accepted.
  void record_spec_decode(int64_t num_draft_tokens, int64_t num_accepted, int engine = 0);

  // The figures behind the periodic log line (vLLM's "Avg prompt throughput: ..."), read now.
  struct Snapshot {
    double prompt_tokens = 0, generation_tokens = 0;  // totals
    double running = 0, waiting = 0, kv_usage = 0;    // gauges
    double prefix_queries = 0, prefix_hits = 0;       // totals
    double preemptions = 0;
    double spec_drafts = 0, spec_draft_tokens = 0, spec_accepted_tokens = 0;  // totals
  };
  // One engine's figures, or (engine -1) every engine's summed, the KV usage averaged.
  Snapshot snapshot(int engine = -1) const;

  // The whole exposition: engine metrics then process metrics. Thread-safe.
  std::string render() const;

  Registry& registry() { return registry_; }
  const std::string& model_name() const { return model_name_; }

 private:
  // One engine's series (label values model_name, its index).
  struct Series {
    std::string index;
    CounterFamily& request_success;  // labels: model_name, engine, finished_reason
    Gauge& num_requests_running;
    Gauge& num_requests_waiting;
    Gauge& kv_cache_usage_perc;
    Counter& prefix_cache_queries;
    Counter& prefix_cache_hits;
    Counter& num_preemptions;
    Counter& prompt_tokens;
    Counter& generation_tokens;
    Histogram& time_to_first_token;
    Histogram& inter_token_latency;
    Histogram& e2e_request_latency;
    Histogram& request_queue_time;
    Histogram& request_prompt_tokens;
    Histogram& request_generation_tokens;
    Histogram& iteration_tokens;
    Counter& spec_num_drafts;
    Counter& spec_num_draft_tokens;
    Counter& spec_num_accepted_tokens;
    CounterFamily& spec_accepted_per_pos;  // labels: model_name, engine, position
    Counter& prompt_computed;
    Counter& prompt_cache_hit;
    Counter& prompt_external;
    // The last totals record_step() saw; guarded by step_mu_.
    uint64_t last_prefix_queries = 0;
    uint64_t last_prefix_hits = 0;
    uint64_t last_preemptions = 0;
  };
  // One engine's KV offload series and the totals last seen (guarded by step_mu_).
  struct OffloadSeries {
    Counter &queries, &hits, &host_hit_tokens, &disk_hit_tokens, &failed_loads, &stored_blocks, &stored_bytes;
    Counter &host_loaded_blocks, &host_loaded_bytes, &disk_loaded_blocks, &disk_loaded_bytes;
    Counter &disk_written_blocks, &disk_written_bytes, &load_seconds, &store_seconds;
    Gauge &host_blocks, &disk_blocks, &host_capacity, &disk_capacity;
    KvOffloadTotals last;
    int64_t last_host_hits = 0, last_host_loaded_blocks = 0, last_host_loaded_bytes = 0;  // host = total - disk
  };
  struct TransferSeries {
    Counter &received_tokens, &received_blocks, &received_bytes, &staged_blocks, &staged_bytes, &sent_blocks, &sent_bytes;
    Counter &failed, &seconds;
    KvOffloadTotals last;
  };
  Series& at(int engine) const;

  const std::string model_name_;
  Registry registry_;
  std::vector<std::unique_ptr<Series>> engines_;
  std::vector<std::unique_ptr<OffloadSeries>> offload_;  // per engine, with kv_offload
  std::vector<std::unique_ptr<TransferSeries>> transfer_;  // per engine, with kv_transfer
  std::mutex step_mu_;
};

}  // namespace pagoda::metrics
