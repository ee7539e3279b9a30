// One-line log records on stderr, as vLLM prints them: "INFO 11-29 12:00:00 [server] message".
// Control bytes in the message (CR, LF, ESC, ...) are written as \xNN, so text that came from a
// request can never forge a log line. Thread-safe (one write per record).
#pragma once

#include <string>
#include <string_view>

namespace pagoda {

enum class LogLevel { kInfo, kWarning, kError };

void log_line(LogLevel level, std::string_view component, std::string_view message);

// The message with control bytes escaped as \xNN (exposed for tests).
std::string escape_log_text(std::string_view text);

}  // namespace pagoda
