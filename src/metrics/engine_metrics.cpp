#include "metrics/engine_metrics.h"

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

EngineMetrics::EngineMetrics(std::string model_name, const CacheConfigInfo& cache,
                             int64_t max_model_len)
    : model_name_(std::move(model_name)),
      request_success_(registry_.add_counter("vllm:request_success",
                                             "Count of successfully processed requests.",
                                             {"model_name", "finished_reason"})),
      num_requests_running_(
          registry_
              .add_gauge("vllm:num_requests_running",
                         "Number of requests in model execution batches.", {"model_name"})
              .with_labels({model_name_})),
      num_requests_waiting_(registry_
                                .add_gauge("vllm:num_requests_waiting",
                                           "Number of requests waiting to be processed.",
                                           {"model_name"})
                                .with_labels({model_name_})),
      kv_cache_usage_perc_(registry_
                               .add_gauge("vllm:kv_cache_usage_perc",
                                          "KV-cache usage. 1 means 100 percent usage.",
                                          {"model_name"})
                               .with_labels({model_name_})),
      prefix_cache_queries_(
          registry_
              .add_counter("vllm:prefix_cache_queries",
                           "Prefix cache queries, in terms of number of queried tokens.",
                           {"model_name"})
              .with_labels({model_name_})),
      prefix_cache_hits_(registry_
                             .add_counter("vllm:prefix_cache_hits",
                                          "Prefix cache hits, in terms of number of cached tokens.",
                                          {"model_name"})
                             .with_labels({model_name_})),
      num_preemptions_(registry_
                           .add_counter("vllm:num_preemptions",
                                        "Cumulative number of preemption from the engine.",
                                        {"model_name"})
                           .with_labels({model_name_})),
      prompt_tokens_(registry_
                         .add_counter("vllm:prompt_tokens", "Number of prefill tokens processed.",
                                      {"model_name"})
                         .with_labels({model_name_})),
      generation_tokens_(registry_
                             .add_counter("vllm:generation_tokens",
                                          "Number of generation tokens processed.", {"model_name"})
                             .with_labels({model_name_})),
      time_to_first_token_(registry_
                               .add_histogram("vllm:time_to_first_token_seconds",
                                              "Histogram of time to first token in seconds.",
                                              {"model_name"}, ttft_buckets())
                               .with_labels({model_name_})),
      inter_token_latency_(registry_
                               .add_histogram("vllm:inter_token_latency_seconds",
                                              "Histogram of inter-token latency in seconds.",
                                              {"model_name"}, inter_token_latency_buckets())
                               .with_labels({model_name_})),
      e2e_request_latency_(
          registry_
              .add_histogram("vllm:e2e_request_latency_seconds",
                             "Histogram of e2e request latency in seconds.", {"model_name"},
                             request_latency_buckets())
              .with_labels({model_name_})),
      request_queue_time_(
          registry_
              .add_histogram("vllm:request_queue_time_seconds",
                             "Histogram of time spent in WAITING phase for request.",
                             {"model_name"}, request_latency_buckets())
              .with_labels({model_name_})),
      request_prompt_tokens_(
          registry_
              .add_histogram("vllm:request_prompt_tokens",
                             "Number of prefill tokens processed.", {"model_name"},
                             buckets_1_2_5(max_model_len))
              .with_labels({model_name_})),
      request_generation_tokens_(
          registry_
              .add_histogram("vllm:request_generation_tokens",
                             "Number of generation tokens processed.", {"model_name"},
                             buckets_1_2_5(max_model_len))
              .with_labels({model_name_})),
      iteration_tokens_(registry_
                            .add_histogram("vllm:iteration_tokens_total",
                                           "Histogram of number of tokens per engine_step.",
                                           {"model_name"}, iteration_tokens_buckets())
                            .with_labels({model_name_})),
      spec_num_drafts_(registry_
                           .add_counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.",
                                        {"model_name"})
                           .with_labels({model_name_})),
      spec_num_draft_tokens_(registry_
                                 .add_counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.",
                                              {"model_name"})
                                 .with_labels({model_name_})),
      spec_num_accepted_tokens_(registry_
                                    .add_counter("vllm:spec_decode_num_accepted_tokens",
                                                 "Number of accepted tokens.", {"model_name"})
                                    .with_labels({model_name_})),
      spec_accepted_per_pos_(registry_.add_counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                                   "Accepted tokens per draft position.",
                                                   {"model_name", "position"})) {
  // Like vLLM, export the usual finish reasons at zero from the start, so that rate() and
  // dashboards see the series before the first request of each kind finishes.
  for (const char* reason : {"stop", "length", "abort", "error"}) {
    request_success_.with_labels({model_name_, reason});
  }
  // Info-style gauge: the configuration is in the labels, the value is always 1. vLLM writes
  // Python's str() of each field, hence "True"/"False".
  registry_
      .add_gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                 {"model_name", "block_size", "num_gpu_blocks", "enable_prefix_caching",
                  "cache_dtype"})
      .with_labels({model_name_, std::to_string(cache.block_size), std::to_string(cache.num_blocks),
                    cache.enable_prefix_caching ? "True" : "False", cache.cache_dtype})
      .set(1);
}

void EngineMetrics::record_step(int64_t num_running, int64_t num_waiting, double kv_usage,
                                uint64_t prefix_queries_total, uint64_t prefix_hits_total,
                                uint64_t preemptions_total, int64_t iteration_tokens) {
  num_requests_running_.set(static_cast<double>(num_running));
  num_requests_waiting_.set(static_cast<double>(num_waiting));
  kv_cache_usage_perc_.set(kv_usage);
  {
    std::lock_guard<std::mutex> lock(step_mu_);
    prefix_cache_queries_.inc(
        static_cast<double>(take_delta(prefix_queries_total, last_prefix_queries_)));
    prefix_cache_hits_.inc(static_cast<double>(take_delta(prefix_hits_total, last_prefix_hits_)));
    num_preemptions_.inc(static_cast<double>(take_delta(preemptions_total, last_preemptions_)));
  }
  if (iteration_tokens > 0) iteration_tokens_.observe(static_cast<double>(iteration_tokens));
}

void EngineMetrics::record_finished(std::string_view reason, int64_t prompt_tokens,
                                    int64_t generation_tokens, double queue_s, double ttft_s,
                                    double e2e_s) {
  request_success_.with_labels({model_name_, std::string(reason)}).inc();
  request_prompt_tokens_.observe(static_cast<double>(prompt_tokens));
  request_generation_tokens_.observe(static_cast<double>(generation_tokens));
  request_queue_time_.observe(queue_s);
  time_to_first_token_.observe(ttft_s);
  e2e_request_latency_.observe(e2e_s);
}

void EngineMetrics::record_inter_token(double seconds) { inter_token_latency_.observe(seconds); }

void EngineMetrics::record_spec_decode(int64_t num_draft_tokens, int64_t num_accepted) {
  spec_num_drafts_.inc();
  spec_num_draft_tokens_.inc(static_cast<double>(num_draft_tokens));
  spec_num_accepted_tokens_.inc(static_cast<double>(num_accepted));
  for (int64_t i = 0; i < num_accepted; ++i) spec_accepted_per_pos_.with_labels({model_name_, std::to_string(i)}).inc();
}

void EngineMetrics::record_tokens(int64_t prompt, int64_t generation) {
  // Negative counts would be a caller bug; Counter::inc checks it.
  prompt_tokens_.inc(static_cast<double>(prompt));
  generation_tokens_.inc(static_cast<double>(generation));
}

std::string EngineMetrics::render() const {
  std::string out = registry_.render();
  append_process_metrics(out);
  return out;
}

EngineMetrics::Snapshot EngineMetrics::snapshot() const {
  Snapshot s;
  s.prompt_tokens = prompt_tokens_.value();
  s.generation_tokens = generation_tokens_.value();
  s.running = num_requests_running_.value();
  s.waiting = num_requests_waiting_.value();
  s.kv_usage = kv_cache_usage_perc_.value();
  s.prefix_queries = prefix_cache_queries_.value();
  s.prefix_hits = prefix_cache_hits_.value();
  s.preemptions = num_preemptions_.value();
  s.spec_drafts = spec_num_drafts_.value();
  s.spec_draft_tokens = spec_num_draft_tokens_.value();
  s.spec_accepted_tokens = spec_num_accepted_tokens_.value();
  return s;
}

}  // namespace pagoda::metrics
