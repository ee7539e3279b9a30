#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "metrics/engine_metrics.h"
#include "metrics/exposition.h"
#include "metrics/metric.h"
#include "metrics/process_metrics.h"
#include "metrics/registry.h"

namespace pagoda::metrics {
namespace {

// ---------------------------------------------------------------------------------------------
// A checker for the text exposition format 0.0.4, standing in for `promtool check metrics`.
// It parses every line by the grammar of the format and then checks the grouping rules:
// HELP/TYPE at most once per family and before its samples, samples of a family contiguous,
// sample names matching the declared type, and histograms well formed (increasing le, cumulative
// counts, a final +Inf bucket equal to _count).

struct Sample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // unescaped values
  double value = 0;
};

bool is_name(const std::string& s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' ||
                    (allow_colon && c == ':') || (i > 0 && c >= '0' && c <= '9');
    if (!ok) return false;
  }
  return true;
}

// A float as Go's strconv.ParseFloat (Prometheus' parser) accepts it, in the forms we emit.
bool parse_value(const std::string& s, double& v) {
  if (s == "+Inf" || s == "Inf") { v = std::numeric_limits<double>::infinity(); return true; }
  if (s == "-Inf") { v = -std::numeric_limits<double>::infinity(); return true; }
  if (s == "NaN") { v = std::numeric_limits<double>::quiet_NaN(); return true; }
  size_t i = 0;
  if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
  size_t digits = 0;
  while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) { ++i; ++digits; }
  if (i < s.size() && s[i] == '.') {
    ++i;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) { ++i; ++digits; }
  }
  if (digits == 0) return false;
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    ++i;
    if (i < s.size() && (s[i] == '+' || s[i] == '-')) ++i;
    size_t exp_digits = 0;
    while (i < s.size() && std::isdigit(static_cast<unsigned char>(s[i]))) { ++i; ++exp_digits; }
    if (exp_digits == 0) return false;
  }
  if (i != s.size()) return false;
  v = std::stod(s);
  return true;
}

// Parses one sample line; returns "" or an error.
std::string parse_sample(const std::string& line, Sample& out) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  out.name = line.substr(0, i);
  if (!is_name(out.name, true)) return "bad metric name";
  if (i < line.size() && line[i] == '{') {
    ++i;
    std::set<std::string> seen;
    while (true) {
      if (i < line.size() && line[i] == '}') { ++i; break; }
      size_t j = i;
      while (j < line.size() && line[j] != '=') ++j;
      const std::string lname = line.substr(i, j - i);
      if (!is_name(lname, false)) return "bad label name '" + lname + "'";
      if (!seen.insert(lname).second) return "duplicate label " + lname;
      if (j + 1 >= line.size() || line[j + 1] != '"') return "label value not quoted";
      i = j + 2;
      std::string value;
      bool closed = false;
      while (i < line.size()) {
        const char c = line[i];
        if (c == '\\') {
          if (i + 1 >= line.size()) return "dangling backslash";
          const char e = line[i + 1];
          if (e == '\\') value += '\\';
          else if (e == '"') value += '"';
          else if (e == 'n') value += '\n';
          else return "bad escape in label value";
          i += 2;
        } else if (c == '"') {
          closed = true;
          ++i;
          break;
        } else {
          value += c;
          ++i;
        }
      }
      if (!closed) return "unterminated label value";
      out.labels.emplace_back(lname, value);
      if (i < line.size() && line[i] == ',') { ++i; continue; }
      if (i < line.size() && line[i] == '}') { ++i; break; }
      return "expected , or } after label";
    }
  }
  if (i >= line.size() || line[i] != ' ') return "expected a space before the value";
  ++i;
  std::string rest = line.substr(i);
  std::string value_text = rest, timestamp;
  if (const size_t sp = rest.find(' '); sp != std::string::npos) {
    value_text = rest.substr(0, sp);
    timestamp = rest.substr(sp + 1);
    double ts;
    if (!parse_value(timestamp, ts) || timestamp.find_first_not_of("-0123456789") != std::string::npos) {
      return "bad timestamp";
    }
  }
  if (!parse_value(value_text, out.value)) return "bad value '" + value_text + "'";
  return "";
}

bool help_escapes_ok(const std::string& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\\') {
      if (i + 1 >= text.size() || (text[i + 1] != '\\' && text[i + 1] != 'n')) return false;
      ++i;
    }
  }
  return true;
}

// Returns every problem found in `text`, one string each ("line N: ..."); empty when valid.
std::vector<std::string> check_exposition(const std::string& text) {
  std::vector<std::string> errors;
  if (!text.empty() && text.back() != '\n') errors.push_back("text does not end with a newline");
  std::map<std::string, std::string> types;  // family -> type
  std::set<std::string> helped, finished_families;
  std::string current_family;
  // Histogram state per (family, labels without le).
  struct HistState {
    double last_le = -std::numeric_limits<double>::infinity();
    double last_count = 0;
    bool has_inf = false;
    double inf_count = -1;
    bool has_count = false, has_sum = false;
    double count = -1;
  };
  std::map<std::string, HistState> hists;

  auto family_of = [&](const std::string& sample_name, std::string& suffix) -> std::string {
    if (types.count(sample_name)) { suffix = ""; return sample_name; }
    for (const char* s : {"_bucket", "_sum", "_count"}) {
      const std::string sfx = s;
      if (sample_name.size() > sfx.size() &&
          sample_name.compare(sample_name.size() - sfx.size(), sfx.size(), sfx) == 0) {
        const std::string base = sample_name.substr(0, sample_name.size() - sfx.size());
        if (types.count(base) && types[base] == "histogram") { suffix = sfx; return base; }
      }
    }
    return "";
  };
  auto enter_family = [&](const std::string& family, int n) {
    if (family == current_family) return;
    if (finished_families.count(family)) {
      errors.push_back("line " + std::to_string(n) + ": family " + family + " is not contiguous");
    }
    if (!current_family.empty()) finished_families.insert(current_family);
    current_family = family;
  };

  std::istringstream in(text);
  std::string line;
  int n = 0;
  while (std::getline(in, line)) {
    ++n;
    const std::string where = "line " + std::to_string(n) + ": ";
    if (line.empty()) { errors.push_back(where + "empty line"); continue; }
    if (line[0] == '#') {
      std::istringstream ls(line);
      std::string hash, keyword, name;
      ls >> hash >> keyword >> name;
      if (hash != "#") { errors.push_back(where + "comment must start with '# '"); continue; }
      if (keyword == "HELP") {
        if (!is_name(name, true)) { errors.push_back(where + "bad HELP name"); continue; }
        const std::string prefix = "# HELP " + name + " ";
        if (line.compare(0, prefix.size(), prefix) != 0) {
          errors.push_back(where + "HELP needs one space-separated docstring");
          continue;
        }
        if (!help_escapes_ok(line.substr(prefix.size()))) errors.push_back(where + "bad HELP escape");
        if (!helped.insert(name).second) errors.push_back(where + "second HELP for " + name);
        enter_family(name, n);
      } else if (keyword == "TYPE") {
        std::string type, extra;
        ls >> type >> extra;
        if (!is_name(name, true)) { errors.push_back(where + "bad TYPE name"); continue; }
        if (line != "# TYPE " + name + " " + type) errors.push_back(where + "malformed TYPE line");
        if (type != "counter" && type != "gauge" && type != "histogram" && type != "summary" &&
            type != "untyped") {
          errors.push_back(where + "unknown type " + type);
        }
        if (types.count(name)) errors.push_back(where + "second TYPE for " + name);
        enter_family(name, n);
        types[name] = type;
      }
      continue;  // other comments are allowed
    }
    Sample s;
    if (const std::string err = parse_sample(line, s); !err.empty()) {
      errors.push_back(where + err + " in: " + line);
      continue;
    }
    std::string suffix;
    const std::string family = family_of(s.name, suffix);
    if (family.empty()) {
      errors.push_back(where + "sample " + s.name + " has no preceding TYPE");
      continue;
    }
    enter_family(family, n);
    const std::string& type = types[family];
    if (type == "counter" && !(s.value >= 0)) errors.push_back(where + "negative counter");
    if (type != "histogram") continue;
    if (suffix.empty()) { errors.push_back(where + "histogram sample without suffix"); continue; }
    std::string key = family + "{";
    std::string le;
    bool has_le = false;
    for (const auto& [k, v] : s.labels) {
      if (k == "le") { le = v; has_le = true; continue; }
      key += k + "=" + v + ",";
    }
    HistState& h = hists[key];
    if (suffix == "_bucket") {
      double bound;
      if (!has_le || !parse_value(le, bound)) { errors.push_back(where + "bucket without valid le"); continue; }
      if (h.has_count || h.has_sum) errors.push_back(where + "bucket after _sum/_count");
      if (!(bound > h.last_le)) errors.push_back(where + "le not increasing");
      if (s.value < h.last_count) errors.push_back(where + "bucket counts not cumulative");
      h.last_le = bound;
      h.last_count = s.value;
      if (std::isinf(bound)) { h.has_inf = true; h.inf_count = s.value; }
    } else {
      if (has_le) errors.push_back(where + "le on _sum/_count");
      if (suffix == "_count") { h.has_count = true; h.count = s.value; }
      if (suffix == "_sum") h.has_sum = true;
    }
  }
  for (const auto& [key, h] : hists) {
    if (!h.has_inf) errors.push_back(key + ": no +Inf bucket");
    if (!h.has_count || !h.has_sum) errors.push_back(key + ": missing _sum or _count");
    if (h.has_inf && h.has_count && h.inf_count != h.count) {
      errors.push_back(key + ": +Inf bucket differs from _count");
    }
  }
  return errors;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += s + "\n";
  return out;
}

// ---------------------------------------------------------------------------------------------

TEST(ExpositionChecker, RejectsBadText) {
  EXPECT_FALSE(check_exposition("foo 1\n").empty());                                 // no TYPE
  EXPECT_FALSE(check_exposition("# TYPE foo gauge\nfoo{a=\"x} 1\n").empty());        // unterminated
  EXPECT_FALSE(check_exposition("# TYPE foo gauge\nfoo{a=\"\\t\"} 1\n").empty());    // bad escape
  EXPECT_FALSE(check_exposition("# TYPE foo gauge\nfoo 1e\n").empty());              // bad value
  EXPECT_FALSE(check_exposition("# TYPE foo gauge\nfoo inf\n").empty());             // bad spelling
  EXPECT_FALSE(check_exposition("# TYPE h histogram\nh_bucket{le=\"1\"} 2\n"
                                "h_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n")
                   .empty());  // not cumulative
  EXPECT_FALSE(check_exposition("# TYPE a gauge\na 1\n# TYPE b gauge\nb 1\na 2\n").empty());
  EXPECT_TRUE(check_exposition("# HELP foo x\\\\y\\n\n# TYPE foo gauge\nfoo{a=\"q\\\"\"} -1.5e-07\n")
                  .empty());
}

TEST(Exposition, FormatsValuesAsPrometheusParsesThem) {
  EXPECT_EQ(format_value(0.0), "0");
  EXPECT_EQ(format_value(-0.0), "0");
  EXPECT_EQ(format_value(3.0), "3");
  EXPECT_EQ(format_value(-7.0), "-7");
  EXPECT_EQ(format_value(16384.0), "16384");
  EXPECT_EQ(format_value(1e15), "1000000000000000");
  EXPECT_EQ(format_value(0.1), "0.1");
  EXPECT_EQ(format_value(2.5), "2.5");
  EXPECT_EQ(format_value(0.001), "0.001");
  EXPECT_EQ(format_value(1e20), "1e+20");
  EXPECT_EQ(format_value(1.5e-7), "1.5e-07");
  EXPECT_EQ(format_value(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(format_value(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(format_value(std::numeric_limits<double>::quiet_NaN()), "NaN");
  for (double v : {0.1, 1.0 / 3.0, 123456.789, 1e-300, 6.02214076e23}) {
    EXPECT_EQ(std::stod(format_value(v)), v) << "round trip of " << format_value(v);
  }
}

TEST(Exposition, Escaping) {
  EXPECT_EQ(escape_help("a\\b\nc\"d"), "a\\\\b\\nc\"d");  // quotes stay in HELP
  EXPECT_EQ(escape_label_value("a\\b\nc\"d"), "a\\\\b\\nc\\\"d");
}

TEST(Registry, RendersCounterWithLabelsAndEscaping) {
  Registry r;
  CounterFamily& f = r.add_counter("http_requests", "The total number of HTTP requests.\nBy \\path.",
                                   {"method", "path"});
  f.with_labels({"post", "/a\"b\\c\nd"}).inc(1027);
  f.with_labels({"get", "/"}).inc(3);
  f.with_labels({"get", "/"}).inc(0.5);
  const std::string expected =
      "# HELP http_requests_total The total number of HTTP requests.\\nBy \\\\path.\n"
      "# TYPE http_requests_total counter\n"
      "http_requests_total{method=\"get\",path=\"/\"} 3.5\n"
      "http_requests_total{method=\"post\",path=\"/a\\\"b\\\\c\\nd\"} 1027\n";
  EXPECT_EQ(r.render(), expected);
  EXPECT_TRUE(check_exposition(r.render()).empty()) << join(check_exposition(r.render()));
}

TEST(Registry, RendersGaugesWithAndWithoutLabels) {
  Registry r;
  GaugeFamily& plain = r.add_gauge("temperature_celsius", "Current temperature.", {});
  GaugeFamily& labelled = r.add_gauge("vllm:num_requests_running", "Running.", {"model_name"});
  plain.with_labels({}).set(-2.5);
  Gauge& g = labelled.with_labels({"m"});
  g.inc(5);
  g.dec(2);
  r.add_gauge("unused", "No series yet.", {"x"});
  GaugeFamily& special = r.add_gauge("special", "Non-finite values.", {"k"});
  special.with_labels({"inf"}).set(std::numeric_limits<double>::infinity());
  special.with_labels({"nan"}).set(std::numeric_limits<double>::quiet_NaN());
  special.with_labels({"ninf"}).set(-std::numeric_limits<double>::infinity());
  const std::string expected =
      "# HELP temperature_celsius Current temperature.\n"
      "# TYPE temperature_celsius gauge\n"
      "temperature_celsius -2.5\n"
      "# HELP vllm:num_requests_running Running.\n"
      "# TYPE vllm:num_requests_running gauge\n"
      "vllm:num_requests_running{model_name=\"m\"} 3\n"
      "# HELP unused No series yet.\n"
      "# TYPE unused gauge\n"
      "# HELP special Non-finite values.\n"
      "# TYPE special gauge\n"
      "special{k=\"inf\"} +Inf\n"
      "special{k=\"nan\"} NaN\n"
      "special{k=\"ninf\"} -Inf\n";
  EXPECT_EQ(r.render(), expected);
  EXPECT_TRUE(check_exposition(r.render()).empty()) << join(check_exposition(r.render()));
}

TEST(Registry, RendersHistogramWithCumulativeBuckets) {
  Registry r;
  HistogramFamily& f =
      r.add_histogram("request_duration_seconds", "Request latency.", {"model_name"}, {0.5, 1, 2.5});
  Histogram& h = f.with_labels({"tiny \"q\""});
  for (double v : {0.25, 0.5, 0.75, 3.0}) h.observe(v);  // 0.5 lands in le="0.5": bounds are inclusive
  h.observe(std::numeric_limits<double>::quiet_NaN());   // ignored
  const std::string expected =
      "# HELP request_duration_seconds Request latency.\n"
      "# TYPE request_duration_seconds histogram\n"
      "request_duration_seconds_bucket{model_name=\"tiny \\\"q\\\"\",le=\"0.5\"} 2\n"
      "request_duration_seconds_bucket{model_name=\"tiny \\\"q\\\"\",le=\"1\"} 3\n"
      "request_duration_seconds_bucket{model_name=\"tiny \\\"q\\\"\",le=\"2.5\"} 3\n"
      "request_duration_seconds_bucket{model_name=\"tiny \\\"q\\\"\",le=\"+Inf\"} 4\n"
      "request_duration_seconds_sum{model_name=\"tiny \\\"q\\\"\"} 4.5\n"
      "request_duration_seconds_count{model_name=\"tiny \\\"q\\\"\"} 4\n";
  EXPECT_EQ(r.render(), expected);
  EXPECT_TRUE(check_exposition(r.render()).empty()) << join(check_exposition(r.render()));
}

TEST(Histogram, BucketsAreCumulative) {
  Histogram h({1, 2, 4, 8});
  const std::vector<double> values = {0, 1, 1.5, 2, 3, 5, 7, 8, 9, 100, -1};
  for (double v : values) h.observe(v);
  const Histogram::Snapshot s = h.snapshot();
  ASSERT_EQ(s.cumulative_counts.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    uint64_t expected = 0;
    for (double v : values) expected += v <= s.upper_bounds[i] ? 1 : 0;
    EXPECT_EQ(s.cumulative_counts[i], expected) << "le=" << s.upper_bounds[i];
    EXPECT_LE(s.cumulative_counts[i], s.cumulative_counts[i + 1]);
  }
  EXPECT_EQ(s.cumulative_counts.back(), values.size());
  EXPECT_EQ(s.count, values.size());
  EXPECT_EQ(h.count(), values.size());
  EXPECT_DOUBLE_EQ(s.sum, 135.5);
  EXPECT_DOUBLE_EQ(h.sum(), 135.5);
}

TEST(Family, WithLabelsReturnsStableReferences) {
  Registry r;
  CounterFamily& f = r.add_counter("c", "c", {"a"});
  Counter& first = f.with_labels({"x"});
  for (int i = 0; i < 1000; ++i) f.with_labels({std::to_string(i)});
  EXPECT_EQ(&first, &f.with_labels({"x"}));
}

TEST(Concurrency, IncrementsFromFourThreadsSumExactly) {
  Registry r;
  Counter& c = r.add_counter("c", "c", {}).with_labels({});
  Gauge& g = r.add_gauge("g", "g", {}).with_labels({});
  Histogram& h = r.add_histogram("h", "h", {}, {10, 100}).with_labels({});
  CounterFamily& family = r.add_counter("per_thread", "p", {"t"});
  constexpr int kThreads = 4;
  constexpr int kIters = 100000;
  std::atomic<bool> done{false};
  std::thread reader([&] {
    while (!done.load()) {
      const std::string text = r.render();
      EXPECT_TRUE(check_exposition(text).empty()) << join(check_exposition(text));
    }
  });
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kIters; ++i) {
        c.inc();
        g.inc();
        if (i % 2 == 0) g.dec(2);
        h.observe(static_cast<double>(i % 200));
        family.with_labels({std::to_string(i % 8)}).inc();
      }
    });
  }
  for (auto& th : threads) th.join();
  done = true;
  reader.join();
  EXPECT_EQ(c.value(), static_cast<double>(kThreads * kIters));
  EXPECT_EQ(g.value(), 0.0);  // +1 each iteration, -2 every other one: net 0
  EXPECT_EQ(h.count(), static_cast<uint64_t>(kThreads * kIters));
  double total = 0;
  for (int i = 0; i < 8; ++i) total += family.with_labels({std::to_string(i)}).value();
  EXPECT_EQ(total, static_cast<double>(kThreads * kIters));
  const Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.cumulative_counts[0], static_cast<uint64_t>(kThreads * kIters / 200 * 11));
}

// ---------------------------------------------------------------------------------------------

std::string find_line(const std::string& text, const std::string& prefix) {
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

TEST(EngineMetrics, BucketLayouts) {
  EXPECT_EQ(buckets_1_2_5(100), (std::vector<double>{1, 2, 5, 10, 20, 50, 100}));
  EXPECT_EQ(buckets_1_2_5(4096),
            (std::vector<double>{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000}));
  EXPECT_EQ(buckets_1_2_5(1), (std::vector<double>{1}));
  EXPECT_EQ(ttft_buckets().front(), 0.001);
  EXPECT_EQ(ttft_buckets().back(), 2560);
  EXPECT_EQ(inter_token_latency_buckets().front(), 0.01);
  EXPECT_EQ(inter_token_latency_buckets().back(), 80);
  EXPECT_EQ(request_latency_buckets().front(), 0.3);
  EXPECT_EQ(request_latency_buckets().back(), 7680);
  EXPECT_EQ(iteration_tokens_buckets().front(), 1);
  EXPECT_EQ(iteration_tokens_buckets().back(), 16384);
}

TEST(EngineMetrics, CountersFromRunningTotalsAddOnlyTheDelta) {
  EngineMetrics m("tiny", CacheConfigInfo{16, 512, true, "auto"}, 2048);
  m.record_step(2, 1, 0.25, 10, 4, 1, 64);
  m.record_step(3, 0, 0.5, 25, 9, 1, 32);
  std::string text = m.render();
  EXPECT_EQ(find_line(text, "vllm:prefix_cache_queries_total{"),
            "vllm:prefix_cache_queries_total{model_name=\"tiny\",engine=\"0\"} 25");
  EXPECT_EQ(find_line(text, "vllm:prefix_cache_hits_total{"),
            "vllm:prefix_cache_hits_total{model_name=\"tiny\",engine=\"0\"} 9");
  EXPECT_EQ(find_line(text, "vllm:num_preemptions_total{"),
            "vllm:num_preemptions_total{model_name=\"tiny\",engine=\"0\"} 1");
  EXPECT_EQ(find_line(text, "vllm:num_requests_running{"),
            "vllm:num_requests_running{model_name=\"tiny\",engine=\"0\"} 3");
  EXPECT_EQ(find_line(text, "vllm:num_requests_waiting{"),
            "vllm:num_requests_waiting{model_name=\"tiny\",engine=\"0\"} 0");
  EXPECT_EQ(find_line(text, "vllm:kv_cache_usage_perc{"),
            "vllm:kv_cache_usage_perc{model_name=\"tiny\",engine=\"0\"} 0.5");
  EXPECT_EQ(find_line(text, "vllm:iteration_tokens_total_count{"),
            "vllm:iteration_tokens_total_count{model_name=\"tiny\",engine=\"0\"} 2");
  EXPECT_EQ(find_line(text, "vllm:iteration_tokens_total_sum{"),
            "vllm:iteration_tokens_total_sum{model_name=\"tiny\",engine=\"0\"} 96");

  // The same totals again add nothing; a reset source (smaller total) counts from zero.
  m.record_step(0, 0, 0, 25, 9, 1, 0);
  m.record_step(0, 0, 0, 5, 2, 1, 0);
  text = m.render();
  EXPECT_EQ(find_line(text, "vllm:prefix_cache_queries_total{"),
            "vllm:prefix_cache_queries_total{model_name=\"tiny\",engine=\"0\"} 30");
  EXPECT_EQ(find_line(text, "vllm:prefix_cache_hits_total{"),
            "vllm:prefix_cache_hits_total{model_name=\"tiny\",engine=\"0\"} 11");
  EXPECT_EQ(find_line(text, "vllm:num_preemptions_total{"),
            "vllm:num_preemptions_total{model_name=\"tiny\",engine=\"0\"} 1");
  EXPECT_EQ(find_line(text, "vllm:iteration_tokens_total_count{"),
            "vllm:iteration_tokens_total_count{model_name=\"tiny\",engine=\"0\"} 2");  // 0-token steps skipped
}

TEST(EngineMetrics, RecordsRequestsAndTokens) {
  EngineMetrics m("tiny", CacheConfigInfo{16, 512, false, "auto"}, 1000);
  m.record_tokens(7, 0);
  m.record_tokens(0, 3);
  m.record_finished("stop", 7, 3, 0.01, 0.05, 0.4);
  m.record_finished("length", 7, 16, 0.02, 0.06, 1.2);
  m.record_finished("stop", 1, 1, 0.0, 0.001, 0.3);
  m.record_inter_token(0.02);
  const std::string text = m.render();
  EXPECT_EQ(find_line(text, "vllm:prompt_tokens_total{"),
            "vllm:prompt_tokens_total{model_name=\"tiny\",engine=\"0\"} 7");
  EXPECT_EQ(find_line(text, "vllm:generation_tokens_total{"),
            "vllm:generation_tokens_total{model_name=\"tiny\",engine=\"0\"} 3");
  EXPECT_EQ(find_line(text, "vllm:request_success_total{model_name=\"tiny\",engine=\"0\",finished_reason=\"stop\"}"),
            "vllm:request_success_total{model_name=\"tiny\",engine=\"0\",finished_reason=\"stop\"} 2");
  EXPECT_EQ(find_line(text, "vllm:request_success_total{model_name=\"tiny\",engine=\"0\",finished_reason=\"error\"}"),
            "vllm:request_success_total{model_name=\"tiny\",engine=\"0\",finished_reason=\"error\"} 0");
  EXPECT_EQ(find_line(text, "vllm:request_success_total{model_name=\"tiny\",engine=\"0\",finished_reason=\"length\"}"),
            "vllm:request_success_total{model_name=\"tiny\",engine=\"0\",finished_reason=\"length\"} 1");
  EXPECT_EQ(find_line(text, "vllm:request_generation_tokens_bucket{model_name=\"tiny\",engine=\"0\",le=\"10\"}"),
            "vllm:request_generation_tokens_bucket{model_name=\"tiny\",engine=\"0\",le=\"10\"} 2");
  EXPECT_EQ(find_line(text, "vllm:request_generation_tokens_bucket{model_name=\"tiny\",engine=\"0\",le=\"1000\"}"),
            "vllm:request_generation_tokens_bucket{model_name=\"tiny\",engine=\"0\",le=\"1000\"} 3");
  EXPECT_EQ(find_line(text, "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",engine=\"0\",le=\"0.001\"}"),
            "vllm:time_to_first_token_seconds_bucket{model_name=\"tiny\",engine=\"0\",le=\"0.001\"} 1");
  EXPECT_EQ(find_line(text, "vllm:e2e_request_latency_seconds_bucket{model_name=\"tiny\",engine=\"0\",le=\"0.3\"}"),
            "vllm:e2e_request_latency_seconds_bucket{model_name=\"tiny\",engine=\"0\",le=\"0.3\"} 1");
  EXPECT_EQ(find_line(text, "vllm:inter_token_latency_seconds_count{"),
            "vllm:inter_token_latency_seconds_count{model_name=\"tiny\",engine=\"0\"} 1");
  EXPECT_EQ(find_line(text, "vllm:request_queue_time_seconds_count{"),
            "vllm:request_queue_time_seconds_count{model_name=\"tiny\",engine=\"0\"} 3");
  EXPECT_EQ(find_line(text, "vllm:cache_config_info{"),
            "vllm:cache_config_info{model_name=\"tiny\",engine=\"0\",block_size=\"16\",num_gpu_blocks=\"512\","
            "enable_prefix_caching=\"False\",cache_dtype=\"auto\"} 1");
}

TEST(EngineMetrics, RecordsSpeculativeDecoding) {
  EngineMetrics m("tiny", CacheConfigInfo{16, 512, false, "auto"}, 1000);
  m.record_spec_decode(4, 2);  // drafts 0 and 1 accepted
  m.record_spec_decode(3, 0);
  m.record_spec_decode(4, 4);
  const std::string text = m.render();
  EXPECT_EQ(find_line(text, "vllm:spec_decode_num_drafts_total{"), "vllm:spec_decode_num_drafts_total{model_name=\"tiny\",engine=\"0\"} 3");
  EXPECT_EQ(find_line(text, "vllm:spec_decode_num_draft_tokens_total{"),
            "vllm:spec_decode_num_draft_tokens_total{model_name=\"tiny\",engine=\"0\"} 11");
  EXPECT_EQ(find_line(text, "vllm:spec_decode_num_accepted_tokens_total{"),
            "vllm:spec_decode_num_accepted_tokens_total{model_name=\"tiny\",engine=\"0\"} 6");
  const char* per_pos[] = {"2", "2", "1", "1"};
  for (int i = 0; i < 4; ++i) {
    const std::string series = "vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name=\"tiny\",engine=\"0\",position=\"" +
                               std::to_string(i) + "\"}";
    EXPECT_EQ(find_line(text, series), series + " " + per_pos[i]);
  }
  const EngineMetrics::Snapshot snap = m.snapshot();
  EXPECT_EQ(snap.spec_drafts, 3);
  EXPECT_EQ(snap.spec_draft_tokens, 11);
  EXPECT_EQ(snap.spec_accepted_tokens, 6);
}

TEST(EngineMetrics, ExportsEveryVllmNameWithModelNameAndValidSyntax) {
  EngineMetrics m("org/model \"v1\"", CacheConfigInfo{16, 128, true, "auto"}, 4096);
  m.record_step(1, 2, 0.1, 5, 2, 0, 12);
  m.record_finished("abort", 10, 2, 0.1, 0.2, 0.5);
  const std::string text = m.render();
  const std::string model = "model_name=\"org/model \\\"v1\\\"\"";
  struct Expected {
    const char* exposed;  // name on HELP/TYPE lines
    const char* type;
  };
  const Expected required[] = {
      {"vllm:num_requests_running", "gauge"},
      {"vllm:num_requests_waiting", "gauge"},
      {"vllm:kv_cache_usage_perc", "gauge"},
      {"vllm:cache_config_info", "gauge"},
      {"vllm:prefix_cache_queries_total", "counter"},
      {"vllm:prefix_cache_hits_total", "counter"},
      {"vllm:num_preemptions_total", "counter"},
      {"vllm:prompt_tokens_total", "counter"},
      {"vllm:generation_tokens_total", "counter"},
      {"vllm:request_success_total", "counter"},
      {"vllm:time_to_first_token_seconds", "histogram"},
      {"vllm:inter_token_latency_seconds", "histogram"},
      {"vllm:e2e_request_latency_seconds", "histogram"},
      {"vllm:request_queue_time_seconds", "histogram"},
      {"vllm:request_prompt_tokens", "histogram"},
      {"vllm:request_generation_tokens", "histogram"},
      {"vllm:iteration_tokens_total", "histogram"},
  };
  for (const Expected& e : required) {
    const std::string name = e.exposed;
    EXPECT_NE(text.find("\n# TYPE " + name + " " + e.type + "\n"), std::string::npos) << name;
    EXPECT_NE(text.find("# HELP " + name + " "), std::string::npos) << name;
    const std::string sample =
        std::string(e.type) == "histogram" ? name + "_bucket{" + model : name + "{" + model;
    EXPECT_FALSE(find_line(text, sample).empty()) << sample;
  }
  for (const char* p : {"process_resident_memory_bytes ", "process_virtual_memory_bytes ",
                        "process_cpu_seconds_total ", "process_open_fds ",
                        "process_start_time_seconds "}) {
    EXPECT_FALSE(find_line(text, p).empty()) << p;
  }
  EXPECT_NE(text.find("# TYPE process_cpu_seconds_total counter\n"), std::string::npos);
  const auto errors = check_exposition(text);
  EXPECT_TRUE(errors.empty()) << join(errors) << text;
}

TEST(ProcessMetrics, ReadsPlausibleValues) {
  const ProcessStats s = read_process_stats();
  ASSERT_TRUE(s.resident_memory_bytes && s.virtual_memory_bytes && s.cpu_seconds && s.open_fds &&
              s.start_time_seconds);
  EXPECT_GT(*s.resident_memory_bytes, 0);
  EXPECT_GE(*s.virtual_memory_bytes, *s.resident_memory_bytes);
  EXPECT_GE(*s.cpu_seconds, 0);
  EXPECT_GE(*s.open_fds, 3);
  EXPECT_GT(*s.start_time_seconds, 1.5e9);  // after 2017
  std::string out;
  append_process_metrics(out, ProcessStats{});  // nothing readable: nothing written
  EXPECT_EQ(out, "");
}

}  // namespace
}  // namespace pagoda::metrics
