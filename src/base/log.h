// One-line log records on stderr, as vLLM prints them: "INFO 11-29 12:00:00 [server] message".
// Control bytes in the message (CR, LF, ESC, ...) are written as \xNN, so text that came from a
// request can never forge a log line. Thread-safe (one write per record).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace pagoda {

enum class LogLevel { kDebug, kInfo, kWarning, kError, kCritical };

// Writes the record when `level` is at or above the process's log level (default info).
void log_line(LogLevel level, std::string_view component, std::string_view message);

// The least severe level written from now on (--log-level); set once at start-up by apps/.
void set_log_level(LogLevel level);
// "debug", "info", "warning", "error", "critical" (vLLM's names); nullopt for anything else.
std::optional<LogLevel> parse_log_level(std::string_view name);

// The message with control bytes escaped as \xNN (exposed for tests).
std::string escape_log_text(std::string_view text);

}  // namespace pagoda
