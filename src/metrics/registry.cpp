#include "metrics/registry.h"

#include <utility>

#include "base/check.h"

namespace pagoda::metrics {

namespace {

bool is_name_char(char c, bool first, bool allow_colon) {
  const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  const bool digit = c >= '0' && c <= '9';
  return alpha || (allow_colon && c == ':') || (!first && digit);
}

bool valid_name(const std::string& s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    if (!is_name_char(s[i], i == 0, allow_colon)) return false;
  }
  return true;
}

}  // namespace

void Registry::check_new(const std::string& name, const std::vector<std::string>& label_names,
                         bool histogram) const {
  PAGODA_CHECK(valid_name(name, /*allow_colon=*/true));
  for (const std::string& l : label_names) {
    PAGODA_CHECK(valid_name(l, /*allow_colon=*/false));
    PAGODA_CHECK(l.rfind("__", 0) != 0);  // reserved for Prometheus' internal use
    PAGODA_CHECK(!(histogram && l == "le"));
  }
  for (const auto& f : families_) PAGODA_CHECK(f->name() != name);
}

CounterFamily& Registry::add_counter(std::string name, std::string help,
                                     std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  check_new(name, label_names, false);
  auto f = std::make_unique<CounterFamily>(std::move(name), std::move(help), std::move(label_names));
  CounterFamily& ref = *f;
  families_.push_back(std::move(f));
  return ref;
}

GaugeFamily& Registry::add_gauge(std::string name, std::string help,
                                 std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  check_new(name, label_names, false);
  auto f = std::make_unique<GaugeFamily>(std::move(name), std::move(help), std::move(label_names));
  GaugeFamily& ref = *f;
  families_.push_back(std::move(f));
  return ref;
}

HistogramFamily& Registry::add_histogram(std::string name, std::string help,
                                         std::vector<std::string> label_names,
                                         std::vector<double> upper_bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  check_new(name, label_names, true);
  // Validate the layout now rather than at the first with_labels().
  { Histogram probe(upper_bounds); }
  auto f = std::make_unique<HistogramFamily>(std::move(name), std::move(help),
                                             std::move(label_names), std::move(upper_bounds));
  HistogramFamily& ref = *f;
  families_.push_back(std::move(f));
  return ref;
}

void Registry::render(std::string& out) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : families_) f->render(out);
}

std::string Registry::render() const {
  std::string out;
  render(out);
  return out;
}

}  // namespace pagoda::metrics
