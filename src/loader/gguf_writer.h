// GgufWriter: builds a GGUF v3 file (alignment 32) in memory and writes it out. For tests and
// tools that need small model files; it is not tuned for large models (it copies every tensor).
//
// Metadata is written in the order added; tensors are laid out in the order added, each at an
// offset aligned to 32, with the data section padded to 32 as the format requires. Adding the
// same key or tensor name twice is a bug (PAGODA_CHECK), as is tensor data whose size does not
// match its shape and type. Not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/gguf_file.h"
#include "tensor/tensor.h"

namespace pagoda {

class GgufWriter {
 public:
  static constexpr uint64_t kAlignment = 32;

  // One metadata entry each.
  void add_string(const std::string& key, const std::string& value);
  void add_u32(const std::string& key, uint32_t value);
  void add_i32(const std::string& key, int32_t value);
  void add_f32(const std::string& key, float value);
  void add_bool(const std::string& key, bool value);
  void add_u64(const std::string& key, uint64_t value);
  void add_string_array(const std::string& key, const std::vector<std::string>& values);
  void add_f32_array(const std::string& key, const std::vector<float>& values);
  void add_i32_array(const std::string& key, const std::vector<int32_t>& values);
  // A value read by GgufFile, copied with its own type (e.g. from one file to another). Returns
  // false, adding nothing, for an array of arrays (GgufFile does not expose their elements).
  bool add_value(const std::string& key, const GgufValue& value);

  // A tensor of `dtype` with `shape` outermost first (written in GGUF's innermost-first order);
  // `bytes` is its row-major data, exactly dtype_bytes(dtype, numel) long, and is copied.
  void add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                  std::span<const uint8_t> bytes);
  // The same for a Tensor view (its dtype, shape and nbytes() of data).
  void add_tensor(const std::string& name, const Tensor& tensor);

  // The whole file's bytes.
  std::vector<uint8_t> to_bytes() const;
  // Writes to_bytes() to `path`; kIoError naming the path on failure.
  Status write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
  };
  void begin_kv(const std::string& key, GgufType type);
  void put_u32(uint32_t v);
  void put_u64(uint64_t v);
  void put_string(const std::string& s);

  std::vector<uint8_t> kv_;  // serialized metadata entries
  uint64_t num_kv_ = 0;
  std::vector<std::string> keys_;
  std::vector<PendingTensor> tensors_;
};

// Writes `bytes` to `path` (created or truncated); kIoError naming the path on failure.
Status write_file(const std::string& path, std::span<const uint8_t> bytes);

}  // namespace pagoda
