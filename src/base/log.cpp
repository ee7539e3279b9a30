#include "base/log.h"

#include <atomic>
#include <cstdio>
#include <utility>
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

namespace {
std::atomic<int> g_min_level{static_cast<int>(LogLevel::kInfo)};
constexpr const char* kNames[] = {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"};
}  // namespace

void set_log_level(LogLevel level) { g_min_level.store(static_cast<int>(level)); }

std::optional<LogLevel> parse_log_level(std::string_view name) {
  static constexpr std::pair<std::string_view, LogLevel> kLevels[] = {
      {"debug", LogLevel::kDebug}, {"info", LogLevel::kInfo}, {"warning", LogLevel::kWarning},
      {"error", LogLevel::kError}, {"critical", LogLevel::kCritical}};
  for (const auto& [n, level] : kLevels) {
    if (n == name) return level;
  }
  return std::nullopt;
}

void log_line(LogLevel level, std::string_view component, std::string_view message) {
  if (static_cast<int>(level) < g_min_level.load(std::memory_order_relaxed)) return;
  const char* name = kNames[static_cast<int>(level)];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%m-%d %H:%M:%S", &tm);
  std::string line = std::string(name) + " " + stamp + " [" + std::string(component) + "] " + escape_log_text(message) + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace pagoda
