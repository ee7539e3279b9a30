#include "fuzz_support.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace pagoda::fuzz {

void fail(const char* condition, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", file, line, condition);
  std::abort();
}

volatile uint8_t kept;
void keep(uint8_t byte) { kept = byte; }

MemFile::MemFile(const uint8_t* data, size_t size) {
  fd_ = ::memfd_create("pagoda-fuzz", 0);
  FUZZ_CHECK(fd_ >= 0);
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::write(fd_, data + done, size - done);
    FUZZ_CHECK(n > 0);
    done += static_cast<size_t>(n);
  }
  path_ = "/proc/self/fd/" + std::to_string(fd_);
}

MemFile::~MemFile() { ::close(fd_); }

const std::string& scratch_dir() {
  static const std::string dir = [] {
    std::string tmpl = (std::filesystem::temp_directory_path() / "pagoda-fuzz-XXXXXX").string();
    FUZZ_CHECK(::mkdtemp(tmpl.data()) != nullptr);
    return tmpl;
  }();
  return dir;
}

void write_scratch_file(const std::string& name, std::string_view data) {
  std::ofstream out(scratch_dir() + "/" + name, std::ios::binary | std::ios::trunc);
  out.write(data.data(), static_cast<std::streamsize>(data.size()));
  FUZZ_CHECK(out.good());
}

std::string find_model_file(const std::string& relative) {
  std::string dir = std::string(PAGODA_SOURCE_DIR) + "/../shared/models";
  if (const char* env = std::getenv("PAGODA_TEST_DATA"); env != nullptr && *env != '\0') dir = env;
  const std::string path = dir + "/" + relative;
  return std::filesystem::exists(path) ? path : std::string();
}

void require_test_data(const char* target, bool found) {
  if (found) return;
  std::fprintf(stderr, "%s: test data missing under ../shared/models (set PAGODA_TEST_DATA)\n",
               target);
  for (const char* name : {"CI", "PAGODA_REQUIRE_TEST_DATA"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0' && std::string(v) != "0" && std::string(v) != "false")
      std::abort();
  }
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + static_cast<size_t>(len) > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const auto b = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((b & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (b & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

uint8_t Input::take_byte() { return p_ == end_ ? 0 : *p_++; }

uint32_t Input::take_u32() {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v = (v << 8) | take_byte();
  return v;
}

std::string_view Input::take_until(char sep) {
  const uint8_t* start = p_;
  while (p_ != end_ && *p_ != static_cast<uint8_t>(sep)) ++p_;
  std::string_view field(reinterpret_cast<const char*>(start), static_cast<size_t>(p_ - start));
  if (p_ != end_) ++p_;
  return field;
}

std::string_view Input::rest() {
  std::string_view r(reinterpret_cast<const char*>(p_), static_cast<size_t>(end_ - p_));
  p_ = end_;
  return r;
}

}  // namespace pagoda::fuzz
