#include "apps/pagoda/bench/serve_stats.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <random>
#include <string_view>

namespace pagoda::app::bench {

double percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double rank = std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (rank - static_cast<double>(lo));
}

MetricStats metric_stats(const std::vector<double>& values, const std::vector<double>& ps) {
  MetricStats m;
  if (!values.empty()) {
    double sum = 0;
    for (double v : values) sum += v;
    m.mean = sum / static_cast<double>(values.size());
    double sq = 0;
    for (double v : values) sq += (v - m.mean) * (v - m.mean);
    m.std = std::sqrt(sq / static_cast<double>(values.size()));  // numpy's default (population)
    m.median = percentile(values, 50);
  }
  for (double p : ps) m.percentiles[p] = percentile(values, p);
  return m;
}

ServeSummary summarize(const std::vector<RequestRecord>& records, double duration,
                       const std::vector<double>& ps, const Goals& goals) {
  ServeSummary s;
  s.duration = duration;
  std::vector<double> ttft, tpot, itl, e2el;
  int64_t good = 0;
  std::map<int64_t, int64_t> tokens_per_second;  // 1 s bucket -> output chunks
  std::vector<std::pair<double, int>> events;     // (time, +1 start / -1 end)
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++s.failed;
      continue;
    }
    ++s.completed;
    s.total_input += r.prompt_tokens;
    s.total_output += r.output_tokens;
    ttft.push_back(r.ttft * 1e3);
    e2el.push_back(r.latency * 1e3);
    double this_tpot = 0;
    if (r.output_tokens > 1) {
      this_tpot = (r.latency - r.ttft) / static_cast<double>(r.output_tokens - 1) * 1e3;
      tpot.push_back(this_tpot);
    }
    for (double gap : r.itl) itl.push_back(gap * 1e3);
    for (double t : r.token_times) ++tokens_per_second[static_cast<int64_t>(std::floor(t))];
    events.emplace_back(r.start, +1);
    events.emplace_back(r.start + r.latency, -1);
    bool ok = true;
    if (auto g = goals.find("ttft"); g != goals.end()) ok = ok && r.ttft * 1e3 <= g->second;
    if (auto g = goals.find("tpot"); g != goals.end()) ok = ok && this_tpot <= g->second;
    if (auto g = goals.find("e2el"); g != goals.end()) ok = ok && r.latency * 1e3 <= g->second;
    if (ok) ++good;
  }
  if (duration > 0) {
    s.request_throughput = static_cast<double>(s.completed) / duration;
    s.output_throughput = static_cast<double>(s.total_output) / duration;
    s.total_token_throughput = static_cast<double>(s.total_input + s.total_output) / duration;
    if (!goals.empty()) s.goodput = static_cast<double>(good) / duration;
  }
  for (const auto& [second, n] : tokens_per_second) {
    s.peak_output_throughput = std::max(s.peak_output_throughput, static_cast<double>(n));
  }
  // Ends sort before starts at the same instant: back-to-back requests do not overlap.
  std::sort(events.begin(), events.end());
  int64_t in_flight = 0;
  for (const auto& [t, d] : events) {
    in_flight += d;
    s.peak_concurrency = std::max(s.peak_concurrency, in_flight);
  }
  s.metrics["ttft"] = metric_stats(ttft, ps);
  s.metrics["tpot"] = metric_stats(tpot, ps);
  s.metrics["itl"] = metric_stats(itl, ps);
  s.metrics["e2el"] = metric_stats(e2el, ps);
  return s;
}

namespace {

std::string line(const char* label, double value, int decimals) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s%-10.*f\n", label, decimals, value);
  return buf;
}

std::string p_label(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", p);
  return buf;
}

}  // namespace

std::string format_summary(const ServeSummary& s, const std::vector<std::string>& shown) {
  std::string out = "============ Serving Benchmark Result ============\n";
  out += line("Successful requests:", static_cast<double>(s.completed), 0);
  out += line("Failed requests:", static_cast<double>(s.failed), 0);
  out += line("Benchmark duration (s):", s.duration, 2);
  out += line("Total input tokens:", static_cast<double>(s.total_input), 0);
  out += line("Total generated tokens:", static_cast<double>(s.total_output), 0);
  out += line("Request throughput (req/s):", s.request_throughput, 2);
  if (s.goodput >= 0) out += line("Request goodput (req/s):", s.goodput, 2);
  out += line("Output token throughput (tok/s):", s.output_throughput, 2);
  out += line("Peak output token throughput (tok/s):", s.peak_output_throughput, 2);
  out += line("Peak concurrent requests:", static_cast<double>(s.peak_concurrency), 2);
  out += line("Total Token throughput (tok/s):", s.total_token_throughput, 2);
  const std::map<std::string, std::pair<const char*, const char*>> names = {
      {"ttft", {"Time to First Token", "TTFT"}},
      {"tpot", {"Time per Output Token (excl. 1st token)", "TPOT"}},
      {"itl", {"Inter-token Latency", "ITL"}},
      {"e2el", {"End-to-end Latency", "E2EL"}}};
  for (const std::string& key : shown) {
    auto it = s.metrics.find(key);
    auto name = names.find(key);
    if (it == s.metrics.end() || name == names.end()) continue;
    const MetricStats& m = it->second;
    std::string title = std::string(name->second.first);
    const size_t pad = title.size() + 2 < 50 ? (50 - title.size() - 2) / 2 : 0;
    out += std::string(pad, '-') + " " + title + " " + std::string(50 - pad - title.size() - 2, '-') + "\n";
    const std::string abbr = name->second.second;
    out += line(("Mean " + abbr + " (ms):").c_str(), m.mean, 2);
    out += line(("Median " + abbr + " (ms):").c_str(), m.median, 2);
    for (const auto& [p, v] : m.percentiles) out += line(("P" + p_label(p) + " " + abbr + " (ms):").c_str(), v, 2);
  }
  out += std::string(50, '=') + "\n";
  return out;
}

nlohmann::json summary_json(const ServeSummary& s, const std::vector<RequestRecord>& records) {
  nlohmann::json j = {{"completed", s.completed},
                      {"failed", s.failed},
                      {"duration", s.duration},
                      {"total_input_tokens", s.total_input},
                      {"total_output_tokens", s.total_output},
                      {"request_throughput", s.request_throughput},
                      {"output_throughput", s.output_throughput},
                      {"total_token_throughput", s.total_token_throughput},
                      {"max_output_tokens_per_s", s.peak_output_throughput},
                      {"max_concurrent_requests", s.peak_concurrency}};
  if (s.goodput >= 0) j["request_goodput"] = s.goodput;
  for (const auto& [key, m] : s.metrics) {
    j["mean_" + key + "_ms"] = m.mean;
    j["median_" + key + "_ms"] = m.median;
    j["std_" + key + "_ms"] = m.std;
    for (const auto& [p, v] : m.percentiles) j["p" + p_label(p) + "_" + key + "_ms"] = v;
  }
  nlohmann::json ttfts = nlohmann::json::array(), itls = nlohmann::json::array(), lat = nlohmann::json::array(),
                 in = nlohmann::json::array(), outl = nlohmann::json::array(), errors = nlohmann::json::array(),
                 starts = nlohmann::json::array();
  for (const RequestRecord& r : records) {
    starts.push_back(r.start);
    ttfts.push_back(r.ttft);
    itls.push_back(r.itl);
    lat.push_back(r.latency);
    in.push_back(r.prompt_tokens);
    outl.push_back(r.output_tokens);
    errors.push_back(r.error);
  }
  j["start_times"] = starts;
  j["ttfts"] = ttfts;
  j["itls"] = itls;
  j["latencies"] = lat;
  j["input_lens"] = in;
  j["output_lens"] = outl;
  j["errors"] = errors;
  return j;
}

std::vector<double> arrival_times(int64_t n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> out(static_cast<size_t>(std::max<int64_t>(n, 0)), 0.0);
  if (!(rate > 0) || std::isinf(rate) || !(burstiness > 0)) return out;
  std::mt19937_64 rng(seed);
  // Mean gap theta * k = 1 / rate.
  std::gamma_distribution<double> gap(burstiness, 1.0 / (rate * burstiness));
  double t = 0;
  for (auto& a : out) {
    a = t;
    t += gap(rng);
  }
  return out;
}

SpecDecodeCounters parse_spec_decode_counters(const std::string& text) {
  SpecDecodeCounters c;
  size_t at = 0;
  while (at < text.size()) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    const std::string_view line(text.data() + at, end - at);
    at = end + 1;
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    const size_t value_at = line.rfind(' ');
    if (name_end == std::string_view::npos || value_at == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    const double value = std::strtod(std::string(line.substr(value_at + 1)).c_str(), nullptr);
    if (name == "vllm:spec_decode_num_drafts_total") {
      c.drafts += value;
    } else if (name == "vllm:spec_decode_num_draft_tokens_total") {
      c.draft_tokens += value;
    } else if (name == "vllm:spec_decode_num_accepted_tokens_total") {
      c.accepted_tokens += value;
    } else if (name == "vllm:spec_decode_num_accepted_tokens_per_pos_total") {
      const size_t pos = line.find("position=\"");
      if (pos == std::string_view::npos) continue;
      c.accepted_per_pos[std::strtoll(std::string(line.substr(pos + 10)).c_str(), nullptr, 10)] += value;
    } else {
      continue;
    }
    c.present = true;
  }
  return c;
}

std::string format_spec_decode(const SpecDecodeCounters& before, const SpecDecodeCounters& after, nlohmann::json* j) {
  const double drafts = after.drafts - before.drafts;
  const double draft_tokens = after.draft_tokens - before.draft_tokens;
  const double accepted = after.accepted_tokens - before.accepted_tokens;
  if (!after.present || drafts <= 0 || draft_tokens <= 0) return "";
  const double rate = 100 * accepted / draft_tokens, length = 1 + accepted / drafts;
  std::string out = "---------------Speculative Decoding---------------\n";
  out += line("Acceptance rate (%):", rate, 2);
  out += line("Acceptance length:", length, 2);
  out += line("Drafts:", drafts, 0);
  out += line("Draft tokens:", draft_tokens, 0);
  out += line("Accepted tokens:", accepted, 0);
  std::vector<double> per_pos;
  for (const auto& [pos, n] : after.accepted_per_pos) {
    auto b = before.accepted_per_pos.find(pos);
    per_pos.push_back(100 * (n - (b == before.accepted_per_pos.end() ? 0 : b->second)) / drafts);
  }
  std::string positions;
  for (double v : per_pos) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%s%.2f", positions.empty() ? "" : ", ", v);
    positions += buf;
  }
  out += "Per-position acceptance (%):            " + positions + "\n";
  (*j)["spec_decode_acceptance_rate"] = rate;
  (*j)["spec_decode_acceptance_length"] = length;
  (*j)["spec_decode_num_drafts"] = drafts;
  (*j)["spec_decode_draft_tokens"] = draft_tokens;
  (*j)["spec_decode_accepted_tokens"] = accepted;
  (*j)["spec_decode_per_position_acceptance_rates"] = per_pos;
  return out;
}

}  // namespace pagoda::app::bench
