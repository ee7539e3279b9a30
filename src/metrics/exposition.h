// Helpers for the Prometheus text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
// Pure functions on strings; thread-safe. Used by MetricFamily::render and process metrics.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagoda::metrics {

// Content-Type of the rendered text, for the HTTP /metrics route.
inline constexpr const char* kExpositionContentType = "text/plain; version=0.0.4; charset=utf-8";

// Formats a sample value the way Prometheus parses it: "+Inf", "-Inf", "NaN"; integral values
// below 2^53 in magnitude as plain integers ("3", "0", "16384"); anything else as the shortest
// round-trip decimal (std::to_chars), e.g. "0.001", "2.5", "1.5e+300".
std::string format_value(double v);

// Escapes HELP text: backslash -> \\, newline -> \n.
std::string escape_help(std::string_view s);

// Escapes a label value: backslash -> \\, double quote -> \", newline -> \n.
std::string escape_label_value(std::string_view s);

// Appends "# HELP name help\n# TYPE name type\n" (help escaped).
void append_header(std::string& out, std::string_view name, std::string_view help,
                   std::string_view type);

// Appends one sample line: `name{l1="v1",l2="v2"} value\n`, or `name value\n` without labels.
// Label values are escaped here. names.size() must equal values.size().
void append_sample(std::string& out, std::string_view name,
                   const std::vector<std::string>& label_names,
                   const std::vector<std::string>& label_values, double value);

}  // namespace pagoda::metrics
