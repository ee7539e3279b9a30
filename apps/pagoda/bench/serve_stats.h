// The statistics of `pagoda bench serve`, computed as vLLM's benchmark_serving computes them, so
// the two tools' reports can be compared line by line:
//   TTFT  time to the first output token of a request;
//   TPOT  (E2E - TTFT) / (output tokens - 1), for requests with more than one output token;
//   ITL   every gap between two successive streamed chunks, across all requests;
//   E2EL  the whole request, send to last byte.
// Percentiles interpolate linearly between closest ranks (numpy.percentile's default).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace pagoda::app::bench {

// One request as the client saw it. Times in seconds since the benchmark started.
struct RequestRecord {
  bool success = false;
  std::string error;           // why not, when !success
  double start = 0;            // sent
  double ttft = 0;             // first token, relative to start
  double latency = 0;          // last byte, relative to start
  std::vector<double> itl;     // gaps between successive chunks
  std::vector<double> token_times;  // absolute arrival time of each chunk (for peak throughput)
  int64_t prompt_tokens = 0;   // from the server's usage
  int64_t output_tokens = 0;   // from the server's usage
};

// numpy.percentile(values, p) with linear interpolation; 0 for no values. p in [0, 100].
double percentile(std::vector<double> values, double p);

struct MetricStats {
  double mean = 0, median = 0, std = 0;
  std::map<double, double> percentiles;  // p -> value
};
MetricStats metric_stats(const std::vector<double>& values, const std::vector<double>& ps);

struct ServeSummary {
  int64_t completed = 0, failed = 0;
  double duration = 0;
  int64_t total_input = 0, total_output = 0;
  double request_throughput = 0, output_throughput = 0, total_token_throughput = 0;
  double peak_output_throughput = 0;  // most output tokens within any 1 s bucket
  int64_t peak_concurrency = 0;       // most requests in flight at once
  double goodput = -1;                // requests/s meeting every goal; -1 when no goal is set
  // Keyed "ttft", "tpot", "itl", "e2el"; values in milliseconds.
  std::map<std::string, MetricStats> metrics;
};

// Goals for goodput, in milliseconds, keyed "ttft", "tpot", "e2el" (vLLM's --goodput).
using Goals = std::map<std::string, double>;

ServeSummary summarize(const std::vector<RequestRecord>& records, double duration,
                       const std::vector<double>& percentiles, const Goals& goals);

// vLLM's report layout ("============ Serving Benchmark Result ============").
std::string format_summary(const ServeSummary& s, const std::vector<std::string>& shown_metrics);

// The --save-result file: the summary plus every request's timings.
nlohmann::json summary_json(const ServeSummary& s, const std::vector<RequestRecord>& records);

// A server's speculative-decoding counters, read from its /metrics text (vLLM's names, summed
// over label sets; per position from the `position` label). present: the server exports them.
struct SpecDecodeCounters {
  bool present = false;
  double drafts = 0, draft_tokens = 0, accepted_tokens = 0;
  std::map<int64_t, double> accepted_per_pos;
};
SpecDecodeCounters parse_spec_decode_counters(const std::string& metrics_text);

// What a run added between two readings, as vLLM's bench serve reports it ("---- Speculative
// Decoding ----": acceptance rate, acceptance length, drafts, draft tokens, accepted tokens,
// per-position acceptance), also into `j`'s spec_decode_* fields; "" when no drafts were verified.
std::string format_spec_decode(const SpecDecodeCounters& before, const SpecDecodeCounters& after, nlohmann::json* j);

// vLLM's arrival process: gaps drawn from a gamma distribution with shape `burstiness` and mean
// 1 / rate (burstiness 1 = Poisson). rate <= 0 or infinite: everything at time 0.
std::vector<double> arrival_times(int64_t n, double rate, double burstiness, uint64_t seed);

}  // namespace pagoda::app::bench
