// Hugging Face config.json text to ModelConfig: any bytes either give a config or an error that
// names the file.
#include <string>

#include "fuzz_support.h"
#include "loader/config_parsers.h"

using namespace pagoda;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = config_from_hf_json(text, "fuzz/config.json");
  if (!config.ok()) {
    FUZZ_CHECK(config.status().message().find("fuzz/config.json") != std::string::npos);
  }
  return 0;
}
