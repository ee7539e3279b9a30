// GgufFile: a parsed, validated, memory-mapped GGUF file (versions 2 and 3).
//
// open() checks every count, length, offset and size against the file with checked arithmetic
// before using it, so a truncated or corrupted file fails with a Status naming the path and the
// problem (never a crash, never an allocation sized by an unchecked field). Metadata arrays are
// not copied: numeric arrays stay views into the mapping. Vocab-only files (no tensors) may end
// right after the metadata, without alignment padding. Immutable after open: thread-safe to read.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace pagoda {

enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};

struct GgufValue {
  GgufType type = GgufType::kUint8;
  // Scalars (set according to type): integers in i/u, floats in f, bool in b, strings in s.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  bool b = false;
  std::string_view s;  // view into the mapping
  // Arrays: element type and count; strings listed as views, numerics as raw little-endian
  // bytes in the mapping (count * element size, bounds checked at open).
  GgufType elem_type = GgufType::kUint8;
  uint64_t count = 0;
  std::vector<std::string_view> strings;
  const uint8_t* raw = nullptr;
};

struct GgufTensorInfo {
  std::string name;
  Tensor tensor;      // dims outermost first (GGUF's order reversed); data points into the mapping
  uint64_t offset;    // relative to the start of the data section
};

class GgufFile {
 public:
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);

  const std::string& path() const;
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }

  // Metadata. The typed getters fail (naming path and key) when the key is missing or has an
  // incompatible type; integer getters accept any integer type whose value fits.
  const GgufValue* find(std::string_view key) const;
  Result<std::string> get_string(std::string_view key) const;
  Result<int64_t> get_int(std::string_view key) const;
  Result<double> get_float(std::string_view key) const;  // float32/float64 (and integers)
  Result<bool> get_bool(std::string_view key) const;
  Result<std::vector<std::string_view>> get_string_array(std::string_view key) const;
  Result<std::vector<float>> get_float_array(std::string_view key) const;
  Result<std::vector<int64_t>> get_int_array(std::string_view key) const;
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // The mapping that tensors point into; keep it alive as long as the tensors are used.
  std::shared_ptr<const MappedFile> mapping() const { return file_; }

 private:
  GgufFile() = default;
  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  friend class GgufParser;
};

}  // namespace pagoda
