// Wire: the byte encoding of messages that cross a process or host boundary (the step messages
// between the scheduler's rank and the workers). Fixed-width little-endian integers and floats,
// vectors and strings as a 64-bit count and then their elements; no padding, no versioning (both
// ends run the same build; a start-up handshake checks that).
//
// ByteWriter appends. ByteReader reads with bounds checks and remembers the first failure, so a
// decoder reads every field and checks finish() once: bytes from another process are input, and
// a short or corrupted message is an error, never an out-of-bounds read. Plain values,
// thread-compatible.
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "base/status.h"

namespace pagoda {

static_assert(std::endian::native == std::endian::little, "the wire format is little-endian, as is the host");

class ByteWriter {
 public:
  template <class T>
  void put(T value) {
    static_assert(std::is_arithmetic_v<T>);
    append(&value, sizeof value);
  }
  void put_bool(bool value) { put<uint8_t>(value ? 1 : 0); }
  // A count, then the elements' bytes (T: integers or floats).
  template <class T>
  void put_vector(std::span<const T> values) {
    static_assert(std::is_arithmetic_v<T>);
    put<uint64_t>(values.size());
    append(values.data(), values.size_bytes());
  }
  template <class T>
  void put_vector(const std::vector<T>& values) {
    put_vector(std::span<const T>(values));
  }
  void put_string(const std::string& s) {
    put<uint64_t>(s.size());
    append(s.data(), s.size());
  }

  const std::vector<uint8_t>& bytes() const { return out_; }
  std::vector<uint8_t> take() { return std::move(out_); }

 private:
  void append(const void* p, size_t n) {
    if (n == 0) return;  // p may be null (an empty vector's data())
    const auto* b = static_cast<const uint8_t*>(p);
    out_.insert(out_.end(), b, b + n);
  }
  std::vector<uint8_t> out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::span<const uint8_t> bytes) : bytes_(bytes) {}

  // Each getter returns the next field, or a zero value once the message has run short (then
  // every later read fails too, and finish() reports the first failure).
  template <class T>
  T get() {
    static_assert(std::is_arithmetic_v<T>);
    T value{};
    if (take(sizeof value)) {
      std::memcpy(&value, bytes_.data() + pos_ - sizeof value, sizeof value);
    }
    return value;
  }
  bool get_bool() {
    const uint8_t v = get<uint8_t>();
    if (v > 1) fail("a bool field holds " + std::to_string(v));
    return v == 1;
  }
  template <class T>
  std::vector<T> get_vector() {
    static_assert(std::is_arithmetic_v<T>);
    const uint64_t count = get<uint64_t>();
    std::vector<T> values;
    // Checked against what is left before anything is allocated: a corrupted count cannot ask
    // for more memory than the message holds.
    if (count > remaining() / sizeof(T)) {
      fail("a vector of " + std::to_string(count) + " elements, but " + std::to_string(remaining()) +
           " bytes are left");
      return values;
    }
    if (count == 0) return values;  // memcpy may not be given the empty vector's null data()
    values.resize(count);
    if (take(count * sizeof(T))) std::memcpy(values.data(), bytes_.data() + pos_ - count * sizeof(T), count * sizeof(T));
    return values;
  }
  std::string get_string() {
    const uint64_t size = get<uint64_t>();
    if (size > remaining()) {
      fail("a string of " + std::to_string(size) + " bytes, but " + std::to_string(remaining()) + " are left");
      return {};
    }
    if (size == 0) return {};
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), size);
    pos_ += size;
    return s;
  }
  // A count of items that follow, each at least `min_item_bytes` long: fails (returning 0) when
  // the rest of the message cannot hold that many.
  uint64_t get_count(uint64_t min_item_bytes) {
    const uint64_t count = get<uint64_t>();
    if (min_item_bytes > 0 && count > remaining() / min_item_bytes) {
      fail("a count of " + std::to_string(count) + " items, but " + std::to_string(remaining()) + " bytes are left");
      return 0;
    }
    return count;
  }

  // Marks the message bad (a decoder's own check, e.g. a value out of range); the first failure
  // is the one reported.
  void fail(const std::string& what) {
    if (error_.empty()) error_ = what + " at byte " + std::to_string(pos_);
    pos_ = bytes_.size();
    failed_ = true;
  }
  bool ok() const { return !failed_; }
  size_t remaining() const { return bytes_.size() - pos_; }

  // Ok when every read succeeded and the whole message was read; else data_loss naming `what`
  // and the first problem.
  Status finish(const std::string& what) const {
    if (failed_) return data_loss(what + ": " + error_);
    if (pos_ != bytes_.size()) {
      return data_loss(what + ": " + std::to_string(bytes_.size() - pos_) + " bytes left over after the message");
    }
    return Status::ok_status();
  }

 private:
  bool take(size_t n) {
    if (failed_) return false;
    if (n > remaining()) {
      fail("the message ends inside a field of " + std::to_string(n) + " bytes (" + std::to_string(remaining()) +
           " left)");
      return false;
    }
    pos_ += n;
    return true;
  }

  std::span<const uint8_t> bytes_;
  size_t pos_ = 0;
  bool failed_ = false;
  std::string error_;
};

}  // namespace pagoda
