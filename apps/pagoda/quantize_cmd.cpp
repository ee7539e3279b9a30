// `pagoda quantize IN OUT --type TYPE`: the tools library's offline quantization
// (tools/quantize/quantize.h), its progress and summary on stdout.
#include <cstdio>

#include "apps/pagoda/commands.h"

namespace pagoda::app {

int run_quantize(const QuantizeFlags& flags) {
  const Status st = quantize(flags, [](std::string_view line) {
    std::printf("%.*s\n", static_cast<int>(line.size()), line.data());
    std::fflush(stdout);
  });
  return st.ok() ? 0 : fail(st);
}

}  // namespace pagoda::app
