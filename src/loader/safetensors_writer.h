// SafetensorsWriter: builds a .safetensors file in memory and writes it out. For tests and tools
// that need small checkpoints (e.g. a random model written as a Hugging Face directory).
//
// Tensors (F32, F16 or BF16) are stored contiguously in the order added; the JSON header lists
// them (sorted by name, as JSON objects are) and is padded with spaces to a multiple of 8 bytes.
// Adding a name twice, another dtype, or data whose size does not match the shape is a bug
// (PAGODA_CHECK). Not thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "tensor/tensor.h"

namespace pagoda {

class SafetensorsWriter {
 public:
  // A tensor with `shape` outermost first; `bytes` (row-major, exactly numel * element size
  // long) is copied.
  void add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                  std::span<const uint8_t> bytes);
  // The same for a Tensor view (its dtype, shape and nbytes() of data).
  void add_tensor(const std::string& name, const Tensor& tensor);
  // An entry of the "__metadata__" object.
  void add_metadata(const std::string& key, const std::string& value);

  // The whole file's bytes.
  std::vector<uint8_t> to_bytes() const;
  // Writes to_bytes() to `path`; kIoError naming the path on failure.
  Status write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    uint64_t begin;
    uint64_t end;
  };
  std::vector<PendingTensor> tensors_;
  std::vector<uint8_t> data_;
  std::map<std::string, std::string> metadata_;
};

}  // namespace pagoda
