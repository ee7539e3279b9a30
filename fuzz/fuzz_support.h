// Helpers shared by the fuzz targets in fuzz/ (libFuzzer entry points, see fuzz/README.md).
//
// A finding is a crash, a sanitizer report, or a broken invariant: FUZZ_CHECK aborts with the
// condition and its place, so libFuzzer saves the input. Targets must be deterministic (no
// clocks, no randomness) and leave no state behind between inputs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagoda::fuzz {

[[noreturn]] void fail(const char* condition, const char* file, int line);

#define FUZZ_CHECK(cond) ((cond) ? (void)0 : ::pagoda::fuzz::fail(#cond, __FILE__, __LINE__))

// Stores `byte` where the optimizer cannot drop the reads that produced it.
void keep(uint8_t byte);

// An in-memory file (memfd) holding `data`, reachable by path (/proc/self/fd/N) for the loaders
// that take paths. Closed with the object.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size);
  ~MemFile();
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// A directory of this process for targets that need a folder (tokenizer.json), made once and
// reused by every input.
const std::string& scratch_dir();
// Writes `data` to scratch_dir()/name, replacing what was there.
void write_scratch_file(const std::string& name, std::string_view data);

// The real model files (../shared/models, or PAGODA_TEST_DATA); "" when `relative` is missing.
std::string find_model_file(const std::string& relative);

// For targets that need the real model files: when `found` is false, says so on stderr, and
// aborts when CI (or PAGODA_REQUIRE_TEST_DATA) is set, as the tests do; otherwise the target
// runs as a no-op.
void require_test_data(const char* target, bool found);

// True when `s` is valid UTF-8 (no overlongs, no surrogates, nothing above U+10FFFF).
bool is_valid_utf8(std::string_view s);

// Reads the input as a sequence of fields: take_byte/take_u32 consume from the front, rest()
// the remainder. Past the end, numbers are 0 and strings empty.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  uint8_t take_byte();
  uint32_t take_u32();
  // Up to the next `sep` byte (consumed) or the end.
  std::string_view take_until(char sep);
  std::string_view rest();
  bool empty() const { return p_ == end_; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

}  // namespace pagoda::fuzz
