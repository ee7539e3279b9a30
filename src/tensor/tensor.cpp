#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>

namespace pagoda {

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

Buffer::Buffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  data_.reset(p);
}

void Buffer::Free::operator()(void* p) const { std::free(p); }

}  // namespace pagoda
