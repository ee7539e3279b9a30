#include "metrics/engine_metrics.h"

#include <algorithm>
#include <utility>

#include "base/check.h"
#include "metrics/process_metrics.h"

namespace pagoda::metrics {

std::vector<double> ttft_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,   0.75,
          1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

std::vector<double> inter_token_latency_buckets() {
  return {0.01, 0.025, 0.05, 0.075, 0.1,  0.15, 0.2,  0.3,  0.4, 0.5,
          0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}

std::vector<double> request_latency_buckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

std::vector<double> iteration_tokens_buckets() {
  return {1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}

std::vector<double> buckets_1_2_5(int64_t max_value) {
  PAGODA_CHECK(max_value >= 1);
  std::vector<double> out;
  for (int64_t exponent = 1;; exponent *= 10) {
    for (int64_t m : {1, 2, 5}) {
      const int64_t v = m * exponent;
      if (v > max_value) return out;
      out.push_back(static_cast<double>(v));
    }
  }
}

namespace {

// Increase of a running total since `last`, updating `last`. A smaller total means the source
// was reset (e.g. the prefix cache was cleared): count the new total as the increase.
uint64_t take_delta(uint64_t total, uint64_t& last) {
  const uint64_t delta = total >= last ? total - last : total;
  last = total;
  return delta;
}

}  // namespace

EngineMetrics::EngineMetrics(std::string model_name, const CacheConfigInfo& cache, int64_t max_model_len,
                             int num_engines)
    : model_name_(std::move(model_name)) {
  PAGODA_CHECK(num_engines >= 1);
  const std::vector<std::string> labels = {"model_name", "engine"};
  auto& request_success = registry_.add_counter("vllm:request_success", "Count of successfully processed requests.",
                                                {"model_name", "engine", "finished_reason"});
  auto& running = registry_.add_gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels);
  auto& waiting = registry_.add_gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels);
  auto& kv_usage = registry_.add_gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels);
  auto& prefix_queries = registry_.add_counter("vllm:prefix_cache_queries",
                                               "Prefix cache queries, in terms of number of queried tokens.", labels);
  auto& prefix_hits =
      registry_.add_counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", labels);
  auto& preemptions =
      registry_.add_counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels);
  auto& prompt_tokens = registry_.add_counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels);
  auto& generation_tokens =
      registry_.add_counter("vllm:generation_tokens", "Number of generation tokens processed.", labels);
  auto& ttft = registry_.add_histogram("vllm:time_to_first_token_seconds",
                                       "Histogram of time to first token in seconds.", labels, ttft_buckets());
  auto& itl = registry_.add_histogram("vllm:inter_token_latency_seconds",
                                      "Histogram of inter-token latency in seconds.", labels,
                                      inter_token_latency_buckets());
  auto& e2e = registry_.add_histogram("vllm:e2e_request_latency_seconds",
                                      "Histogram of e2e request latency in seconds.", labels,
                                      request_latency_buckets());
  auto& queue = registry_.add_histogram("vllm:request_queue_time_seconds",
                                        "Histogram of time spent in WAITING phase for request.", labels,
                                        request_latency_buckets());
  auto& request_prompt = registry_.add_histogram("vllm:request_prompt_tokens", "Number of prefill tokens processed.",
                                                 labels, buckets_1_2_5(max_model_len));
  auto& request_generation = registry_.add_histogram(
      "vllm:request_generation_tokens", "Number of generation tokens processed.", labels, buckets_1_2_5(max_model_len));
  auto& iteration = registry_.add_histogram("vllm:iteration_tokens_total",
                                            "Histogram of number of tokens per engine_step.", labels,
                                            iteration_tokens_buckets());
  auto& drafts = registry_.add_counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels);
  auto& draft_tokens = registry_.add_counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels);
  auto& accepted = registry_.add_counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels);
  auto& per_pos = registry_.add_counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted tokens per draft position.", {"model_name", "engine", "position"});
  auto& by_source = registry_.add_counter("vllm:prompt_tokens_by_source",
                                          "Prompt tokens by where their KV came from.",
                                          {"model_name", "engine", "source"});
  // Info-style gauge: the configuration is in the labels, the value is always 1. vLLM writes
  // Python's str() of each field, hence "True"/"False".
  auto& cache_info = registry_.add_gauge(
      "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
      {"model_name", "engine", "block_size", "num_gpu_blocks", "enable_prefix_caching", "cache_dtype"});
  for (int e = 0; e < num_engines; ++e) {
    const std::string index = std::to_string(e);
    const std::vector<std::string> values = {model_name_, index};
    engines_.push_back(std::unique_ptr<Series>(new Series{
        index, request_success, running.with_labels(values), waiting.with_labels(values), kv_usage.with_labels(values),
        prefix_queries.with_labels(values), prefix_hits.with_labels(values), preemptions.with_labels(values),
        prompt_tokens.with_labels(values), generation_tokens.with_labels(values), ttft.with_labels(values),
        itl.with_labels(values), e2e.with_labels(values), queue.with_labels(values), request_prompt.with_labels(values),
        request_generation.with_labels(values), iteration.with_labels(values), drafts.with_labels(values),
        draft_tokens.with_labels(values), accepted.with_labels(values), per_pos,
        by_source.with_labels({model_name_, index, "local_compute"}),
        by_source.with_labels({model_name_, index, "local_cache_hit"}),
        by_source.with_labels({model_name_, index, "external_kv_transfer"})}));
    // Like vLLM, export the usual finish reasons at zero from the start, so that rate() and
    // dashboards see the series before the first request of each kind finishes.
    for (const char* reason : {"stop", "length", "abort", "error"}) request_success.with_labels({model_name_, index, reason});
    cache_info
        .with_labels({model_name_, index, std::to_string(cache.block_size), std::to_string(cache.num_blocks),
                      cache.enable_prefix_caching ? "True" : "False", cache.cache_dtype})
        .set(1);
  }
  if (cache.kv_transfer) {
    auto& tokens = registry_.add_counter("vllm:kv_transfer_received_tokens",
                                         "Prompt tokens whose KV was received from a prefill instance.", labels);
    auto& rblocks = registry_.add_counter("vllm:kv_transfer_received_blocks",
                                          "KV blocks received from prefill instances (this rank's shard).", labels);
    auto& rbytes = registry_.add_counter("vllm:kv_transfer_received_bytes", "Bytes received from prefill instances.",
                                         labels);
    auto& kblocks = registry_.add_counter("vllm:kv_transfer_staged_blocks",
                                          "KV blocks of prompts kept for decode instances (this rank's shard).", labels);
    auto& kbytes = registry_.add_counter("vllm:kv_transfer_staged_bytes", "Bytes kept for decode instances.", labels);
    auto& sblocks = registry_.add_counter("vllm:kv_transfer_sent_blocks",
                                          "KV blocks served to decode instances (this rank's shard).", labels);
    auto& sbytes = registry_.add_counter("vllm:kv_transfer_sent_bytes", "Bytes served to decode instances.", labels);
    auto& failed = registry_.add_counter("vllm:kv_transfer_failed",
                                         "Receives that failed (the prompt was computed here).", labels);
    auto& seconds = registry_.add_counter("vllm:kv_transfer_seconds",
                                          "Time from a receive's start to its last byte, summed.", labels);
    for (int e = 0; e < num_engines; ++e) {
      const std::vector<std::string> v = {model_name_, std::to_string(e)};
      transfer_.push_back(std::unique_ptr<TransferSeries>(new TransferSeries{
          tokens.with_labels(v), rblocks.with_labels(v), rbytes.with_labels(v), kblocks.with_labels(v),
          kbytes.with_labels(v), sblocks.with_labels(v), sbytes.with_labels(v), failed.with_labels(v),
          seconds.with_labels(v), KvOffloadTotals{}}));
    }
  }
  if (!cache.kv_offload) return;
  const std::vector<std::string> tiered = {"model_name", "engine", "tier"};
  auto& ext_queries = registry_.add_counter("vllm:external_prefix_cache_queries",
                                            "External prefix cache queries from KV connector, in tokens.", labels);
  auto& ext_hits = registry_.add_counter("vllm:external_prefix_cache_hits",
                                         "External prefix cache hits from KV connector, in tokens.", labels);
  auto& hit_tokens = registry_.add_counter("vllm:kv_offload_hit_tokens", "Tokens loaded from a KV offload tier.", tiered);
  auto& failed = registry_.add_counter("vllm:kv_offload_failed_loads",
                                       "KV offload loads that failed (the tokens were computed).", labels);
  auto& stored_blocks = registry_.add_counter("vllm:kv_offload_stored_blocks",
                                              "KV blocks saved into the host tier.", labels);
  auto& stored_bytes = registry_.add_counter("vllm:kv_offload_stored_bytes", "Bytes saved into the host tier.", labels);
  auto& loaded_blocks = registry_.add_counter("vllm:kv_offload_loaded_blocks",
                                              "KV blocks loaded into the KV cache from a tier.", tiered);
  auto& loaded_bytes = registry_.add_counter("vllm:kv_offload_loaded_bytes", "Bytes loaded from a tier.", tiered);
  auto& written_blocks = registry_.add_counter("vllm:kv_offload_disk_written_blocks",
                                               "KV block files written to the disk tier.", labels);
  auto& written_bytes = registry_.add_counter("vllm:kv_offload_disk_written_bytes",
                                              "Bytes written to the disk tier.", labels);
  auto& seconds = registry_.add_counter("vllm:kv_offload_seconds", "Time spent copying KV blocks.",
                                        {"model_name", "engine", "direction"});
  auto& blocks = registry_.add_gauge("vllm:kv_offload_blocks", "KV blocks held in a tier.", tiered);
  auto& capacity = registry_.add_gauge("vllm:kv_offload_capacity_blocks", "KV blocks a tier can hold.", tiered);
  for (int e = 0; e < num_engines; ++e) {
    const std::string i = std::to_string(e);
    const std::vector<std::string> v = {model_name_, i};
    const std::vector<std::string> host = {model_name_, i, "host"}, disk = {model_name_, i, "disk"};
    offload_.push_back(std::unique_ptr<OffloadSeries>(new OffloadSeries{
        ext_queries.with_labels(v), ext_hits.with_labels(v), hit_tokens.with_labels(host), hit_tokens.with_labels(disk),
        failed.with_labels(v), stored_blocks.with_labels(v), stored_bytes.with_labels(v),
        loaded_blocks.with_labels(host), loaded_bytes.with_labels(host), loaded_blocks.with_labels(disk),
        loaded_bytes.with_labels(disk), written_blocks.with_labels(v), written_bytes.with_labels(v),
        seconds.with_labels({model_name_, i, "load"}), seconds.with_labels({model_name_, i, "store"}),
        blocks.with_labels(host), blocks.with_labels(disk), capacity.with_labels(host), capacity.with_labels(disk),
        KvOffloadTotals{}, 0, 0, 0}));
  }
}

void EngineMetrics::record_prompt_sources(int64_t computed, int64_t cache_hit, int64_t external, int engine) {
  Series& s = at(engine);
  s.prompt_computed.inc(static_cast<double>(computed));
  s.prompt_cache_hit.inc(static_cast<double>(cache_hit));
  s.prompt_external.inc(static_cast<double>(external));
}

void EngineMetrics::record_kv_offload(const KvOffloadTotals& t, int engine) {
  PAGODA_CHECK(engine >= 0 && engine < num_engines());
  std::lock_guard<std::mutex> lock(step_mu_);
  auto grow = [](Counter& c, int64_t total, int64_t& last) {
    c.inc(static_cast<double>(total >= last ? total - last : total));
    last = total;
  };
  if (!transfer_.empty()) {
    TransferSeries& x = *transfer_[static_cast<size_t>(engine)];
    grow(x.received_tokens, t.remote_hits, x.last.remote_hits);
    grow(x.received_blocks, t.received_blocks, x.last.received_blocks);
    grow(x.received_bytes, t.received_bytes, x.last.received_bytes);
    grow(x.staged_blocks, t.staged_blocks, x.last.staged_blocks);
    grow(x.staged_bytes, t.staged_bytes, x.last.staged_bytes);
    grow(x.sent_blocks, t.sent_blocks, x.last.sent_blocks);
    grow(x.sent_bytes, t.sent_bytes, x.last.sent_bytes);
    grow(x.failed, t.failed_transfers, x.last.failed_transfers);
    x.seconds.inc(std::max(0.0, t.transfer_seconds - x.last.transfer_seconds));
    x.last.transfer_seconds = t.transfer_seconds;
  }
  if (offload_.empty()) return;
  OffloadSeries& s = *offload_[static_cast<size_t>(engine)];
  KvOffloadTotals& l = s.last;
  grow(s.queries, t.queries, l.queries);
  grow(s.hits, t.hits, l.hits);
  grow(s.host_hit_tokens, t.hits - t.disk_hits, s.last_host_hits);
  grow(s.disk_hit_tokens, t.disk_hits, l.disk_hits);
  grow(s.failed_loads, t.failed_loads, l.failed_loads);
  grow(s.stored_blocks, t.stored_blocks, l.stored_blocks);
  grow(s.stored_bytes, t.stored_bytes, l.stored_bytes);
  grow(s.host_loaded_blocks, t.loaded_blocks - t.disk_loaded_blocks, s.last_host_loaded_blocks);
  grow(s.host_loaded_bytes, t.loaded_bytes - t.disk_loaded_bytes, s.last_host_loaded_bytes);
  grow(s.disk_loaded_blocks, t.disk_loaded_blocks, l.disk_loaded_blocks);
  grow(s.disk_loaded_bytes, t.disk_loaded_bytes, l.disk_loaded_bytes);
  grow(s.disk_written_blocks, t.disk_written_blocks, l.disk_written_blocks);
  grow(s.disk_written_bytes, t.disk_written_bytes, l.disk_written_bytes);
  s.load_seconds.inc(std::max(0.0, t.load_seconds - l.load_seconds));
  s.store_seconds.inc(std::max(0.0, t.store_seconds - l.store_seconds));
  l.load_seconds = t.load_seconds;
  l.store_seconds = t.store_seconds;
  s.host_blocks.set(static_cast<double>(t.host_blocks));
  s.disk_blocks.set(static_cast<double>(t.disk_blocks));
  s.host_capacity.set(static_cast<double>(t.host_capacity));
  s.disk_capacity.set(static_cast<double>(t.disk_capacity));
}

EngineMetrics::Series& EngineMetrics::at(int engine) const {
  PAGODA_CHECK(engine >= 0 && engine < num_engines());
  return *engines_[static_cast<size_t>(engine)];
}

void EngineMetrics::record_step(int64_t num_running, int64_t num_waiting, double kv_usage,
                                uint64_t prefix_queries_total, uint64_t prefix_hits_total,
                                uint64_t preemptions_total, int64_t iteration_tokens, int engine) {
  Series& s = at(engine);
  s.num_requests_running.set(static_cast<double>(num_running));
  s.num_requests_waiting.set(static_cast<double>(num_waiting));
  s.kv_cache_usage_perc.set(kv_usage);
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    s.prefix_cache_queries.inc(static_cast<double>(take_delta(prefix_queries_total, s.last_prefix_queries)));
    s.prefix_cache_hits.inc(static_cast<double>(take_delta(prefix_hits_total, s.last_prefix_hits)));
    s.num_preemptions.inc(static_cast<double>(take_delta(preemptions_total, s.last_preemptions)));
  }
  if (iteration_tokens > 0) s.iteration_tokens.observe(static_cast<double>(iteration_tokens));
}

void EngineMetrics::record_finished(std::string_view reason, int64_t prompt_tokens, int64_t generation_tokens,
                                    double queue_s, double ttft_s, double e2e_s, int engine) {
  Series& s = at(engine);
  s.request_success.with_labels({model_name_, s.index, std::string(reason)}).inc();
  s.request_prompt_tokens.observe(static_cast<double>(prompt_tokens));
  s.request_generation_tokens.observe(static_cast<double>(generation_tokens));
  s.request_queue_time.observe(queue_s);
  s.time_to_first_token.observe(ttft_s);
  s.e2e_request_latency.observe(e2e_s);
}

void EngineMetrics::record_inter_token(double seconds, int engine) { at(engine).inter_token_latency.observe(seconds); }

void EngineMetrics::record_spec_decode(int64_t num_draft_tokens, int64_t num_accepted, int engine) {
  Series& s = at(engine);
  s.spec_num_drafts.inc();
  s.spec_num_draft_tokens.inc(static_cast<double>(num_draft_tokens));
  s.spec_num_accepted_tokens.inc(static_cast<double>(num_accepted));
  for (int64_t i = 0; i < num_accepted; ++i) {
    s.spec_accepted_per_pos.with_labels({model_name_, s.index, std::to_string(i)}).inc();
  }
}

void EngineMetrics::record_tokens(int64_t prompt, int64_t generation, int engine) {
  // Negative counts would be a caller bug; Counter::inc checks it.
  Series& s = at(engine);
  s.prompt_tokens.inc(static_cast<double>(prompt));
  s.generation_tokens.inc(static_cast<double>(generation));
}

std::string EngineMetrics::render() const {
  std::string out = registry_.render();
  append_process_metrics(out);
  return out;
}

EngineMetrics::Snapshot EngineMetrics::snapshot(int engine) const {
  Snapshot out;
  const int first = engine < 0 ? 0 : engine;
  const int last = engine < 0 ? num_engines() - 1 : engine;
  for (int e = first; e <= last; ++e) {
    const Series& s = at(e);
    out.prompt_tokens += s.prompt_tokens.value();
    out.generation_tokens += s.generation_tokens.value();
    out.running += s.num_requests_running.value();
    out.waiting += s.num_requests_waiting.value();
    out.kv_usage += s.kv_cache_usage_perc.value() / (last - first + 1);
    out.prefix_queries += s.prefix_cache_queries.value();
    out.prefix_hits += s.prefix_cache_hits.value();
    out.preemptions += s.num_preemptions.value();
    out.spec_drafts += s.spec_num_drafts.value();
    out.spec_draft_tokens += s.spec_num_draft_tokens.value();
    out.spec_accepted_tokens += s.spec_num_accepted_tokens.value();
  }
  return out;
}

}  // namespace pagoda::metrics
