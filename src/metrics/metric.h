// Metric primitives: Counter, Gauge, Histogram, and MetricFamily<T>, a named set of series of
// one type keyed by label values.
//
// Sits at the bottom of metrics/ (depends on base/ only); Registry (metrics/registry.h) owns the
// families and renders them. All types here are thread-safe: the engine thread updates series
// while HTTP threads render them. Counter and Gauge are lock-free atomics; a Histogram takes a
// short mutex per observe() so that a rendered snapshot is consistent (bucket counts, _sum and
// _count always agree).
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace pagoda::metrics {

enum class MetricType { kCounter, kGauge, kHistogram };

// Returns "counter", "gauge" or "histogram", as written on a `# TYPE` line.
const char* metric_type_name(MetricType type);

// A monotonically increasing value (requests, tokens). Rendered with the `_total` suffix.
class Counter {
 public:
  // Adds `v`; v must be finite and >= 0 (a negative or NaN increment is a bug: PAGODA_CHECK).
  void inc(double v = 1.0);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (queue lengths, usage fractions).
class Gauge {
 public:
  void set(double v) { value_.store(v, std::memory_order_relaxed); }
  void inc(double v = 1.0) { value_.fetch_add(v, std::memory_order_relaxed); }
  void dec(double v = 1.0) { value_.fetch_sub(v, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into fixed buckets. `upper_bounds` are the finite, strictly increasing
// inclusive upper bounds (`le`); the +Inf bucket is implicit.
class Histogram {
 public:
  // A consistent copy of the histogram's state. `cumulative_counts` has one entry per finite
  // bound plus a last one for +Inf, which equals `count`.
  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> cumulative_counts;
    double sum = 0.0;
    uint64_t count = 0;
  };

  // Bounds must be finite and strictly increasing (else PAGODA_CHECK: bucket layouts are code).
  explicit Histogram(std::vector<double> upper_bounds);

  // Records one observation; NaN is ignored (it would poison _sum and fits no bucket).
  void observe(double v);
  Snapshot snapshot() const;
  uint64_t count() const;
  double sum() const;
  const std::vector<double>& upper_bounds() const { return upper_bounds_; }

 private:
  const std::vector<double> upper_bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> bucket_counts_;  // guarded by mu_; per bucket, not cumulative; last = +Inf
  double sum_ = 0.0;                     // guarded by mu_
  uint64_t count_ = 0;                   // guarded by mu_
};

// The common, type-independent part of a family: name, help text, type and label names.
class MetricFamilyBase {
 public:
  MetricFamilyBase(std::string name, std::string help, MetricType type,
                   std::vector<std::string> label_names);
  virtual ~MetricFamilyBase() = default;
  MetricFamilyBase(const MetricFamilyBase&) = delete;
  MetricFamilyBase& operator=(const MetricFamilyBase&) = delete;

  // The metric name as registered, e.g. "vllm:prompt_tokens" (counters get "_total" on output).
  const std::string& name() const { return name_; }
  const std::string& help() const { return help_; }
  MetricType type() const { return type_; }
  const std::vector<std::string>& label_names() const { return label_names_; }

  // Appends this family's exposition text (HELP, TYPE, one line per sample) to `out`.
  virtual void render(std::string& out) const = 0;

 private:
  std::string name_;
  std::string help_;
  MetricType type_;
  std::vector<std::string> label_names_;
};

// A family of series of type T (Counter, Gauge or Histogram), one per tuple of label values.
// Thread-safe. Series live as long as the family; references returned by with_labels() stay valid.
template <typename T>
class MetricFamily final : public MetricFamilyBase {
 public:
  // For Histogram families, `upper_bounds` is the bucket layout every series gets.
  MetricFamily(std::string name, std::string help, std::vector<std::string> label_names,
               std::vector<double> upper_bounds = {});

  // Returns the series for `label_values` (one per label name, in order), creating it at zero
  // on first use. A wrong number of values is a bug (PAGODA_CHECK).
  T& with_labels(const std::vector<std::string>& label_values);

  void render(std::string& out) const override;

 private:
  std::vector<double> upper_bounds_;  // Histogram only
  mutable std::mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_;  // guarded by mu_
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;
using HistogramFamily = MetricFamily<Histogram>;

}  // namespace pagoda::metrics
