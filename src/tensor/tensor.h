// Tensor: a non-owning, contiguous, row-major view of typed memory (up to 4 dims).
//
// Shapes are written outermost first, like numpy and PyTorch: a linear layer's weight is
// [out_features, in_features], so one row is one output's weights. (GGUF lists dims innermost
// first; the loader reverses them.) The view never owns its memory: weights point into a
// MappedFile or a Buffer kept alive by their owner. Copyable; no synchronization.
//
// A matmul weight may instead be in a backend's packed layout (TensorLayout::kBackendPacked, made by
// Kernels::pack_matmul_weight): same dtype and shape, but the bytes are arranged the way that
// backend's matmul reads them, so only that matmul may read them (row(), row_bytes() and
// nbytes() describe the row-major form, not the packed bytes).
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "base/check.h"
#include "tensor/dtype.h"

namespace pagoda {

inline constexpr int kMaxDims = 4;

enum class TensorLayout : uint8_t { kRowMajor, kBackendPacked };

struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  TensorLayout layout = TensorLayout::kRowMajor;
  int ndim = 0;
  std::array<int64_t, kMaxDims> shape{};

  Tensor() = default;
  Tensor(void* d, DType t, std::initializer_list<int64_t> dims) : data(d), dtype(t) {
    PAGODA_CHECK(dims.size() <= kMaxDims);
    for (int64_t v : dims) shape[ndim++] = v;
  }

  int64_t dim(int i) const { return shape[i < 0 ? ndim + i : i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < ndim; ++i) n *= shape[i];
    return n;
  }
  int64_t row_len() const { return ndim == 0 ? 1 : shape[ndim - 1]; }   // innermost dim
  int64_t num_rows() const { return row_len() == 0 ? 0 : numel() / row_len(); }
  int64_t row_bytes() const { return row_len() / block_elems(dtype) * block_bytes(dtype); }
  int64_t nbytes() const { return num_rows() * row_bytes(); }

  template <typename T>
  T* as() const { return static_cast<T*>(data); }
  const uint8_t* row(int64_t r) const { return static_cast<const uint8_t*>(data) + r * row_bytes(); }

  std::string shape_string() const;  // "[64, 512]"
};

// Owned memory. Move-only. Host memory (64-byte-aligned, zero-filled), or memory a backend
// allocated (backend/kernels.h's ExecContext::allocate), which it frees through `release`.
class Buffer {
 public:
  using Release = void (*)(const void* owner, void* data, size_t bytes);

  Buffer() = default;
  explicit Buffer(size_t bytes);  // zero-filled host memory
  // Takes `data` (`bytes` long), handing it to release(owner, data, bytes) when done.
  Buffer(void* data, size_t bytes, Release release, const void* owner)
      : data_(data, Free{bytes, release, owner}), size_(bytes) {}
  void* data() const { return data_.get(); }
  size_t size() const { return size_; }
  template <typename T>
  T* as() const { return static_cast<T*>(data()); }

 private:
  struct Free {
    // No initializers: a nested struct with them is not default-constructible inside Buffer,
    // which unique_ptr's default constructor needs.
    size_t mapped_bytes;  // non-zero: the memory came from mmap (or, with release, its size)
    Release release;      // set: someone else's memory, returned through it
    const void* owner;
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> data_;
  size_t size_ = 0;
};

}  // namespace pagoda
