// Running the pagoda binary from a test as a user runs it: stdout and stderr captured apart,
// and the exit status.
#pragma once

#include <string>

namespace pagoda::testing {

struct RunResult {
  int exit_code = -1;
  std::string out;
  std::string err;
};

// Runs `binary` with `args` (already shell-quoted) and the environment assignments `env`
// ("NAME=value ..."), capturing stdout and stderr.
RunResult run_binary(const std::string& binary, const std::string& args, const std::string& env = "");

// `s` quoted for the shell.
std::string shell_quote(const std::string& s);

// The number of '\n' in `s` (how many lines a command printed).
int count_lines(const std::string& s);

}  // namespace pagoda::testing
