#include "tensor/tensor.h"

#include <sys/mman.h>

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

namespace {
// Large buffers (KV caches, dummy weights) come straight from mmap: page-aligned, and zero pages
// are only committed when first touched, so a big KV cache costs nothing until it is used.
constexpr size_t kMmapThreshold = size_t{1} << 20;
}  // namespace

Buffer::Buffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  if (bytes >= kMmapThreshold) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    // Transparent huge pages where the system allows them on request: a buffer filled at load
    // (packed weights) then takes one page fault per 2 MiB instead of one per 4 KiB.
    ::madvise(p, bytes, MADV_HUGEPAGE);
    data_ = std::unique_ptr<void, Free>(p, Free{bytes, nullptr, nullptr});
    return;
  }
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  data_ = std::unique_ptr<void, Free>(p, Free{0, nullptr, nullptr});
}

void Buffer::Free::operator()(void* p) const {
  if (release) {
    release(owner, p, mapped_bytes);
  } else if (mapped_bytes) {
    ::munmap(p, mapped_bytes);
  } else {
    std::free(p);
  }
}

}  // namespace pagoda
