// KvCacheTensors: the memory of the paged KV cache, one key and one value tensor per layer of
// shape [num_blocks, block_size, num_kv_heads, head_dim] of a KvCacheDtype (the layout of
// backend/kernels.h), plus the per-row scales of an int8 cache, in the device's memory.
//
// The block bookkeeping (who owns which block) lives in kv/; this class only holds the memory.
// Owned by the runner; the engine thread alone reads and writes it.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/kernels.h"
#include "base/status.h"
#include "loader/model_config.h"
#include "tensor/tensor.h"

namespace pagoda {

class KvCacheTensors {
 public:
  // Allocates num_blocks blocks of block_size tokens for every layer of `config`, in the memory
  // of the device `kernels` run on; fails with kResourceExhausted when the size overflows or the
  // memory cannot be had.
  static Result<KvCacheTensors> allocate(const Kernels& kernels, const ModelConfig& config, int64_t num_blocks,
                                         int64_t block_size, KvCacheDtype dtype = KvCacheDtype::kF32);

  // Bytes one block takes across all layers (keys and values, and an int8 cache's scales).
  static int64_t bytes_per_block(const ModelConfig& config, int64_t block_size,
                                 KvCacheDtype dtype = KvCacheDtype::kF32);

  KvLayerView layer(int64_t i) const;

  // One block's bytes in host memory, the form a KV connector moves (kv_transfer/): for each
  // layer in order its keys, its values, and an int8 cache's key and value scales, each as the
  // block lies in the cache ([block_size, num_kv_heads, head_dim] of the dtype; scales
  // [block_size, num_kv_heads] f32). Equal to bytes_per_block of this cache's layout.
  int64_t block_bytes() const;
  // Copies block `block` (in [0, num_blocks)) into `dst` (block_bytes() long, host memory), and
  // back, through the device's copy entries.
  void copy_block_to_host(const Kernels& kernels, BlockId block, uint8_t* dst) const;
  void copy_block_from_host(const Kernels& kernels, BlockId block, const uint8_t* src) const;
  int64_t num_blocks() const { return num_blocks_; }
  int64_t block_size() const { return block_size_; }
  int64_t num_layers() const { return static_cast<int64_t>(keys_.size()); }
  int64_t num_kv_heads() const { return num_kv_heads_; }  // this shard's
  int64_t head_dim() const { return head_dim_; }
  KvCacheDtype dtype() const { return dtype_; }

 private:
  // Calls f(device pointer, bytes) for each piece of block `block`, in block_bytes() order.
  template <class F>
  void for_each_piece(BlockId block, F&& f) const;

  int64_t num_blocks_ = 0;
  int64_t block_size_ = 0;
  int64_t num_kv_heads_ = 0;
  int64_t head_dim_ = 0;
  KvCacheDtype dtype_ = KvCacheDtype::kF32;
  std::vector<Buffer> keys_;    // per layer
  std::vector<Buffer> values_;  // per layer
  std::vector<Buffer> key_scales_, value_scales_;  // per layer, int8 caches only
};

}  // namespace pagoda
