// Registry: owns metric families and renders them all in the Prometheus text exposition
// format 0.0.4 (the body of GET /metrics).
//
// Families are registered once at start-up (by EngineMetrics, the server) and live as long as the
// registry; the returned references stay valid. Thread-safe: registration, updates through the
// returned families, and render() may run concurrently.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "metrics/metric.h"

namespace pagoda::metrics {

class Registry {
 public:
  Registry() = default;
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Register a family. `name` is the base name (a counter "vllm:prompt_tokens" renders as
  // "vllm:prompt_tokens_total"). Names must match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
  // [a-zA-Z_][a-zA-Z0-9_]* (not starting with "__", and not "le" for histograms), and a name may
  // be registered only once; breaking these is a bug (PAGODA_CHECK): metric names are code.
  CounterFamily& add_counter(std::string name, std::string help,
                             std::vector<std::string> label_names);
  GaugeFamily& add_gauge(std::string name, std::string help,
                         std::vector<std::string> label_names);
  // `upper_bounds`: finite, strictly increasing bucket bounds; +Inf is added on output.
  HistogramFamily& add_histogram(std::string name, std::string help,
                                 std::vector<std::string> label_names,
                                 std::vector<double> upper_bounds);

  // Appends every family, in registration order, to `out`.
  void render(std::string& out) const;
  std::string render() const;

 private:
  void check_new(const std::string& name, const std::vector<std::string>& label_names,
                 bool histogram) const;  // requires mu_

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<MetricFamilyBase>> families_;  // guarded by mu_
};

}  // namespace pagoda::metrics
