#include "metrics/exposition.h"

#include <charconv>
#include <cmath>
#include <cstdint>

#include "base/check.h"

namespace pagoda::metrics {

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integral values print without a fraction or exponent (counts, token numbers, le="16384").
  // 2^53 bounds the range where every integer is exact in a double.
  constexpr double kMaxExactInteger = 9007199254740992.0;
  if (std::trunc(v) == v && std::fabs(v) < kMaxExactInteger) {
    return std::to_string(static_cast<int64_t>(v));  // also turns -0.0 into "0"
  }
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round-trip form
  PAGODA_CHECK(res.ec == std::errc());
  return std::string(buf, res.ptr);
}

namespace {

std::string escape(std::string_view s, bool quote) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

std::string escape_help(std::string_view s) { return escape(s, /*quote=*/false); }

std::string escape_label_value(std::string_view s) { return escape(s, /*quote=*/true); }

void append_header(std::string& out, std::string_view name, std::string_view help,
                   std::string_view type) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += escape_help(help);
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void append_sample(std::string& out, std::string_view name,
                   const std::vector<std::string>& label_names,
                   const std::vector<std::string>& label_values, double value) {
  PAGODA_CHECK(label_names.size() == label_values.size());
  out += name;
  if (!label_names.empty()) {
    out += '{';
    for (size_t i = 0; i < label_names.size(); ++i) {
      if (i > 0) out += ',';
      out += label_names[i];
      out += "=\"";
      out += escape_label_value(label_values[i]);
      out += '"';
    }
    out += '}';
  }
  out += ' ';
  out += format_value(value);
  out += '\n';
}

}  // namespace pagoda::metrics
