// KvBlockLayout: how one block's bytes lie in host memory for a range of KV heads (the form
// KvCacheTensors::copy_block_to_host writes for a rank's shard), and copying a range of heads
// between two such layouts. Transfers between instances whose tensor-parallel splits differ go
// through it: the sender cuts the heads the receiver asks for out of its shard, the receiver puts
// them into its own. Plain value; the functions are pure.
#pragma once

#include <cstdint>

#include "tensor/kv_cache_dtype.h"

namespace pagoda {

struct KvBlockLayout {
  int64_t num_layers = 0;
  int64_t block_size = 0;
  int64_t head_begin = 0, head_end = 0;  // the KV heads held, of the whole model's
  int64_t head_dim = 0;
  KvCacheDtype dtype = KvCacheDtype::kF32;

  int64_t num_heads() const { return head_end - head_begin; }
  // Per layer: keys [block_size, heads, head_dim], values alike, and an int8 cache's key and value
  // scales [block_size, heads] f32.
  int64_t block_bytes() const;
  // The same layout holding only heads [begin, end).
  KvBlockLayout with_heads(int64_t begin, int64_t end) const;
  bool same_shape(const KvBlockLayout& o) const {
    return num_layers == o.num_layers && block_size == o.block_size && head_dim == o.head_dim && dtype == o.dtype;
  }
};

// Copies heads [begin, end) of one block from `src` (laid out as `from`) into `dst` (laid out as
// `to`). Both layouts must hold those heads and have the same shape (a bug otherwise).
void copy_block_heads(const KvBlockLayout& from, const uint8_t* src, const KvBlockLayout& to, uint8_t* dst,
                      int64_t begin, int64_t end);

}  // namespace pagoda
