#include "support/test_data.h"

#include <cstdlib>
#include <filesystem>

namespace pagoda::testing {

std::string test_data_dir() {
  if (const char* env = std::getenv("PAGODA_TEST_DATA"); env && *env) return env;
  return std::string(PAGODA_SOURCE_DIR) + "/../shared/models";
}

std::string find_test_file(const std::string& relative) {
  std::string path = test_data_dir() + "/" + relative;
  return std::filesystem::exists(path) ? path : std::string();
}

bool test_data_required() {
  for (const char* name : {"CI", "PAGODA_REQUIRE_TEST_DATA"}) {
    const char* v = std::getenv(name);
    if (v && *v && std::string(v) != "0" && std::string(v) != "false") return true;
  }
  return false;
}

std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "pagoda-test-XXXXXX").string();
  char* made = ::mkdtemp(tmpl.data());
  return made ? std::string(made) : std::string();
}

}  // namespace pagoda::testing
