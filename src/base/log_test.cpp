#include "base/log.h"

#include <gtest/gtest.h>

namespace pagoda {
namespace {

// Text from a request (a path, a header) can reach a log line: CR/LF must not start a new,
// forged line, and escape sequences must not reach the terminal (checklist H7, S3).
TEST(Log, ControlBytesAreEscaped) {
  EXPECT_EQ(escape_log_text("GET /x\r\nINFO forged line"), "GET /x\\x0d\\x0aINFO forged line");
  EXPECT_EQ(escape_log_text("\x1b[31mred\x7f"), "\\x1b[31mred\\x7f");
  EXPECT_EQ(escape_log_text(std::string("a\0b", 3)), "a\\x00b");
  EXPECT_EQ(escape_log_text("plain text, UTF-8: é 日本"), "plain text, UTF-8: é 日本");
}

}  // namespace
}  // namespace pagoda
