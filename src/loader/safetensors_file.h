// SafetensorsFile: a parsed, validated, memory-mapped .safetensors file; SafetensorsCheckpoint:
// the tensors of a Hugging Face checkpoint (one file or shards listed by an index).
//
// Format: an 8-byte little-endian header length N, N bytes of JSON ({name: {dtype, shape,
// data_offsets: [begin, end]}, "__metadata__": {string: string}}), then the data region that
// the offsets index. open() checks the header length (at most 100 MiB and inside the file),
// every dtype (F32, F16, BF16; others fail with kUnimplemented naming them), shape (at most 4
// dims) and offset range with checked arithmetic; errors name the file. Tensors are views into
// the mapping (no copy), except the rare tensor whose address is misaligned for its type, which
// is copied into memory the SafetensorsFile owns. Immutable after open: thread-safe to read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/mapped_file.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace pagoda {

struct SafetensorsTensor {
  std::string name;
  Tensor tensor;       // shape outermost first, as in the file
  uint64_t begin = 0;  // data_offsets, relative to the data region
  uint64_t end = 0;
};

class SafetensorsFile {
 public:
  // Maps and validates `path`; kDataLoss / kUnimplemented / kNotFound / kIoError naming it.
  static Result<std::unique_ptr<SafetensorsFile>> open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  // All tensors, sorted by name.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor `name`, or nullptr.
  const SafetensorsTensor* find(std::string_view name) const;
  // The "__metadata__" entries (string values only).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The mapping the tensors point into.
  std::shared_ptr<const MappedFile> mapping() const { return file_; }

 private:
  SafetensorsFile() = default;
  std::shared_ptr<const MappedFile> file_;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::shared_ptr<Buffer>> copies_;  // misaligned tensors, copied
};

// The tensors of a checkpoint by their names in the files. Copyable; the shared_ptrs keep the
// files (and so the tensor memory) alive.
struct SafetensorsCheckpoint {
  std::string source;                      // the directory or index file, for messages
  std::map<std::string, Tensor> tensors;   // views into files[*]
  std::vector<std::shared_ptr<const SafetensorsFile>> files;
};

// Opens a sharded checkpoint from its index (model.safetensors.index.json: {"weight_map":
// {tensor: shard file}}). Every referenced shard is opened once and must exist and contain the
// tensors the index assigns to it; errors name the index or shard path and the tensor.
Result<SafetensorsCheckpoint> open_safetensors_index(const std::string& index_path);

// Opens `dir`/model.safetensors, else `dir`/model.safetensors.index.json; kNotFound when the
// directory holds neither.
Result<SafetensorsCheckpoint> open_safetensors_dir(const std::string& dir);

}  // namespace pagoda
