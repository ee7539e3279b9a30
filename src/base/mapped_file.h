// MappedFile: a read-only memory mapping of a whole file.
//
// Model weights are used in place from the mapping whenever their type allows, so a MappedFile
// must outlive every Tensor view into it. Move-only; immutable after open, so thread-safe to read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"

namespace pagoda {

class MappedFile {
 public:
  // Maps `path` read-only. Fails with kIoError / kNotFound naming the path. An empty file maps
  // to an empty span.
  static Result<std::unique_ptr<MappedFile>> open(const std::string& path);

  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  MappedFile(std::string path, const uint8_t* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}

  std::string path_;
  const uint8_t* data_;
  size_t size_;
};

// Reads a whole (small) file into a string; fails naming the path.
Result<std::string> read_file(const std::string& path);

}  // namespace pagoda
