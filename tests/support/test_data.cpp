#include "support/test_data.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <vector>

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

namespace {

// The directories make_temp_dir made, removed when the process that made them exits (not a
// forked child: a death test's exit must not remove its parent's files).
class TempDirs {
 public:
  ~TempDirs() {
    if (::getpid() != owner_) return;
    for (const std::string& dir : dirs_) {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  }
  void add(std::string dir) {
    const std::lock_guard<std::mutex> lock(mutex_);
    dirs_.push_back(std::move(dir));
  }

 private:
  pid_t owner_ = ::getpid();
  std::mutex mutex_;
  std::vector<std::string> dirs_;
};

TempDirs& temp_dirs() {
  static TempDirs dirs;
  return dirs;
}

}  // namespace

std::string make_temp_dir() {
  std::string tmpl = (std::filesystem::temp_directory_path() / "pagoda-test-XXXXXX").string();
  char* made = ::mkdtemp(tmpl.data());
  if (made == nullptr) return std::string();
  temp_dirs().add(made);
  return made;
}

}  // namespace pagoda::testing
