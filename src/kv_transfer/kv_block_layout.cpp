#include "kv_transfer/kv_block_layout.h"

#include <cstring>

#include "base/check.h"

namespace pagoda {
namespace {

// Bytes of one (slot, head) row of a piece: the elements, or an int8 cache's one f32 scale.
int64_t row_bytes(const KvBlockLayout& l, bool scales) {
  return scales ? static_cast<int64_t>(sizeof(float)) : l.head_dim * kv_cache_elem_bytes(l.dtype);
}

bool has_scales(const KvBlockLayout& l) { return l.dtype == KvCacheDtype::kInt8; }

}  // namespace

int64_t KvBlockLayout::block_bytes() const {
  const int64_t rows = block_size * num_heads();
  int64_t per_layer = 2 * rows * row_bytes(*this, false);
  if (has_scales(*this)) per_layer += 2 * rows * row_bytes(*this, true);
  return num_layers * per_layer;
}

KvBlockLayout KvBlockLayout::with_heads(int64_t begin, int64_t end) const {
  KvBlockLayout l = *this;
  l.head_begin = begin;
  l.head_end = end;
  return l;
}

void copy_block_heads(const KvBlockLayout& from, const uint8_t* src, const KvBlockLayout& to, uint8_t* dst,
                      int64_t begin, int64_t end) {
  PAGODA_CHECK(from.same_shape(to));
  PAGODA_CHECK(begin <= end && from.head_begin <= begin && end <= from.head_end && to.head_begin <= begin &&
               end <= to.head_end);
  const int pieces = has_scales(from) ? 4 : 2;  // keys, values[, key scales, value scales]
  for (int64_t layer = 0; layer < from.num_layers; ++layer) {
    for (int p = 0; p < pieces; ++p) {
      const int64_t row = row_bytes(from, p >= 2);
      const int64_t run = (end - begin) * row;
      for (int64_t slot = 0; slot < from.block_size; ++slot) {
        std::memcpy(dst + (slot * to.num_heads() + (begin - to.head_begin)) * row,
                    src + (slot * from.num_heads() + (begin - from.head_begin)) * row, static_cast<size_t>(run));
      }
      src += from.block_size * from.num_heads() * row;
      dst += to.block_size * to.num_heads() * row;
    }
  }
}

}  // namespace pagoda
