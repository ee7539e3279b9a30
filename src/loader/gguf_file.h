// GgufFile: a parsed, validated, memory-mapped GGUF file (versions 2 and 3).
//
// open() checks every count, length, offset and size against the file with checked arithmetic
// before using it, so a truncated or corrupted file fails with a Status naming the path and the
// problem (never a crash, never an allocation sized by an unchecked field). Metadata arrays are
// not copied: numeric arrays stay views into the mapping. Vocab-only files (no tensors) may end
// right after the metadata, without alignment padding. Immutable after open: thread-safe to read.
//
// Accepted tensor types: F32, F16, BF16, Q8_0, Q4_0 (any other ggml type fails with
// kUnimplemented naming it). Metadata arrays of arrays are validated but their elements are not
// exposed (GgufValue::elem_type == kArray, raw == nullptr, strings empty).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
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

// The name of a metadata value type, e.g. "uint32", "string", "array".
std::string_view gguf_type_name(GgufType t);
// Bytes of one value of a fixed-size metadata type; 0 for strings and arrays.
uint64_t gguf_scalar_size(GgufType t);

// ggml's id of a tensor type (F32=0, F16=1, Q4_0=2, Q4_K=12, BF16=30, ...) of a DType; the
// inverse is dtype_from_ggml_type (tensor/dtype.h). The name of any ggml type id, supported or
// not ("IQ2_XXS"), or "unknown" past the known ids.
uint32_t ggml_type_of(DType t);
std::string_view ggml_type_name(uint32_t ggml_type);

struct GgufValue {
  GgufType type = GgufType::kUint8;
  // Scalars (set according to type): integers in i/u, floats in f, bool in b, strings in s.
  // Unsigned integers set u, and also i when the value fits int64; signed integers set i, and
  // also u when the value is not negative.
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
  uint64_t offset = 0;  // relative to the start of the data section
};

class GgufFile {
 public:
  // Maps and validates `path`. Fails with kDataLoss (truncated or corrupted: the message starts
  // with the path and names the field), kUnimplemented (GGUF v1, big-endian files, unsupported
  // tensor types) or the mapping's kNotFound / kIoError.
  static Result<std::unique_ptr<GgufFile>> open(const std::string& path);

  // The path given to open().
  const std::string& path() const;
  // The format version (2 or 3) and the data alignment (general.alignment, default 32).
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
  // All metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }

  // All tensors in file order; find_tensor returns nullptr when `name` is absent.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* find_tensor(std::string_view name) const;

  // The mapping that tensors point into; keep it alive as long as the tensors are used. (A
  // tensor whose address in the mapping is not aligned for its type, possible only with
  // general.alignment < 4, is copied into memory owned by this GgufFile instead: keep the
  // GgufFile alive, not just the mapping, when that matters.)
  std::shared_ptr<const MappedFile> mapping() const { return file_; }
  // Offset of the tensor data section in the file (0 when there are no tensors).
  uint64_t data_offset() const { return data_offset_; }

 private:
  GgufFile() = default;
  Status type_error(std::string_view key, const GgufValue& v, const char* expected) const;

  std::shared_ptr<const MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;  // name -> index in tensors_
  std::vector<std::shared_ptr<Buffer>> copies_;              // misaligned tensors, copied
  friend class GgufParser;
};

}  // namespace pagoda
