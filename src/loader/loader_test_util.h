// Test-only helpers for the loader tests: a little-endian byte builder for handcrafting GGUF
// and safetensors files, and file writing. Not part of pagoda_loader.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "loader/gguf_writer.h"

namespace pagoda::testing {

struct Bytes {
  std::vector<uint8_t> b;

  template <typename T>
  Bytes& put(T v) {
    uint8_t tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));
    b.insert(b.end(), tmp, tmp + sizeof(T));
    return *this;
  }
  Bytes& u8(uint8_t v) { return put(v); }
  Bytes& u32(uint32_t v) { return put(v); }
  Bytes& i32(int32_t v) { return put(v); }
  Bytes& u64(uint64_t v) { return put(v); }
  Bytes& f32(float v) { return put(v); }
  // A GGUF string: uint64 length + bytes.
  Bytes& str(std::string_view s) {
    u64(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& raw(std::string_view s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& append(const Bytes& o) {
    b.insert(b.end(), o.b.begin(), o.b.end());
    return *this;
  }
  Bytes& zeros(size_t n) {
    b.resize(b.size() + n, 0);
    return *this;
  }
  Bytes& pad_to(uint64_t alignment) {
    b.resize((b.size() + alignment - 1) / alignment * alignment, 0);
    return *this;
  }
  size_t size() const { return b.size(); }
};

// Writes `bytes` to `dir`/`name` and returns the path.
inline std::string write_test_file(const std::string& dir, const std::string& name,
                                   const std::vector<uint8_t>& bytes) {
  std::string path = dir + "/" + name;
  Status s = write_file(path, bytes);
  EXPECT_TRUE(s.ok()) << s.message();
  return path;
}

inline std::string write_text_file(const std::string& dir, const std::string& name,
                                   const std::string& text) {
  return write_test_file(dir, name, std::vector<uint8_t>(text.begin(), text.end()));
}

// `n` f32 values as bytes.
inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> out(v.size() * 4);
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace pagoda::testing
