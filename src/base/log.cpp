#include "base/log.h"

#include <cstdio>
#include <ctime>

namespace pagoda {

std::string escape_log_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (unsigned char c : text) {
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

void log_line(LogLevel level, std::string_view component, std::string_view message) {
  const char* name = level == LogLevel::kInfo ? "INFO" : level == LogLevel::kWarning ? "WARNING" : "ERROR";
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%m-%d %H:%M:%S", &tm);
  std::string line = std::string(name) + " " + stamp + " [" + std::string(component) + "] " + escape_log_text(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace pagoda
