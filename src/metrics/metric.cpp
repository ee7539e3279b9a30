#include "metrics/metric.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "base/check.h"
#include "metrics/exposition.h"

namespace pagoda::metrics {

const char* metric_type_name(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kGauge: return "gauge";
    case MetricType::kHistogram: return "histogram";
  }
  return "untyped";
}

void Counter::inc(double v) {
  PAGODA_CHECK(v >= 0.0 && std::isfinite(v));
  value_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(std::move(upper_bounds)), bucket_counts_(upper_bounds_.size() + 1, 0) {
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    PAGODA_CHECK(std::isfinite(upper_bounds_[i]));
    if (i > 0) PAGODA_CHECK(upper_bounds_[i - 1] < upper_bounds_[i]);
  }
}

void Histogram::observe(double v) {
  if (std::isnan(v)) return;
  // Buckets are inclusive upper bounds (le): the first bound >= v.
  const size_t i = static_cast<size_t>(
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), v) - upper_bounds_.begin());
  std::lock_guard<std::mutex> lock(mu_);
  ++bucket_counts_[i];
  sum_ += v;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = upper_bounds_;
  s.cumulative_counts.reserve(bucket_counts_.size());
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t running = 0;
  for (uint64_t c : bucket_counts_) {
    running += c;
    s.cumulative_counts.push_back(running);
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

uint64_t Histogram::count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return count_;
}

double Histogram::sum() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sum_;
}

MetricFamilyBase::MetricFamilyBase(std::string name, std::string help, MetricType type,
                                   std::vector<std::string> label_names)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)) {}

namespace {

template <typename T>
constexpr MetricType type_of();
template <>
constexpr MetricType type_of<Counter>() { return MetricType::kCounter; }
template <>
constexpr MetricType type_of<Gauge>() { return MetricType::kGauge; }
template <>
constexpr MetricType type_of<Histogram>() { return MetricType::kHistogram; }

// The name written on HELP/TYPE and sample lines. Counters follow the Prometheus convention
// (and prometheus_client, which vLLM uses): "vllm:prompt_tokens" is exposed as
// "vllm:prompt_tokens_total". A name already ending in _total is left alone.
std::string exposed_name(const std::string& name, MetricType type) {
  constexpr std::string_view kSuffix = "_total";
  if (type != MetricType::kCounter) return name;
  if (name.size() >= kSuffix.size() &&
      name.compare(name.size() - kSuffix.size(), kSuffix.size(), kSuffix) == 0) {
    return name;
  }
  return name + std::string(kSuffix);
}

}  // namespace

template <typename T>
MetricFamily<T>::MetricFamily(std::string name, std::string help,
                              std::vector<std::string> label_names,
                              std::vector<double> upper_bounds)
    : MetricFamilyBase(std::move(name), std::move(help), type_of<T>(), std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {}

template <typename T>
T& MetricFamily<T>::with_labels(const std::vector<std::string>& label_values) {
  PAGODA_CHECK(label_values.size() == label_names().size());
  std::lock_guard<std::mutex> lock(mu_);
  auto it = series_.find(label_values);
  if (it == series_.end()) {
    std::unique_ptr<T> series;
    if constexpr (std::is_same_v<T, Histogram>) {
      series = std::make_unique<Histogram>(upper_bounds_);
    } else {
      series = std::make_unique<T>();
    }
    it = series_.emplace(label_values, std::move(series)).first;
  }
  return *it->second;
}

template <typename T>
void MetricFamily<T>::render(std::string& out) const {
  const std::string name = exposed_name(this->name(), type());
  append_header(out, name, help(), metric_type_name(type()));
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [values, series] : series_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot s = series->snapshot();
      std::vector<std::string> names = label_names();
      names.push_back("le");
      std::vector<std::string> bucket_values = values;
      bucket_values.push_back("");
      const std::string bucket_name = name + "_bucket";
      for (size_t i = 0; i < s.cumulative_counts.size(); ++i) {
        bucket_values.back() =
            i < s.upper_bounds.size() ? format_value(s.upper_bounds[i]) : std::string("+Inf");
        append_sample(out, bucket_name, names, bucket_values,
                      static_cast<double>(s.cumulative_counts[i]));
      }
      append_sample(out, name + "_sum", label_names(), values, s.sum);
      append_sample(out, name + "_count", label_names(), values, static_cast<double>(s.count));
    } else {
      append_sample(out, name, label_names(), values, series->value());
    }
  }
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;
template class MetricFamily<Histogram>;

}  // namespace pagoda::metrics
