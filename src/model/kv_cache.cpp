#include "model/kv_cache.h"

#include <new>

#include "base/check.h"
#include "base/checked_math.h"

namespace pagoda {

int64_t KvCacheTensors::bytes_per_block(const ModelConfig& c, int64_t block_size, KvCacheDtype dtype) {
  const int64_t rows = 2 * c.num_layers * block_size * c.num_kv_heads;
  return rows * c.head_dim * kv_cache_elem_bytes(dtype) +
         (dtype == KvCacheDtype::kInt8 ? rows * static_cast<int64_t>(sizeof(float)) : 0);
}

Result<KvCacheTensors> KvCacheTensors::allocate(const Kernels& kernels, const ModelConfig& config, int64_t num_blocks,
                                                int64_t block_size, KvCacheDtype dtype) {
  if (num_blocks <= 0 || block_size <= 0) {
    return invalid_argument("KV cache needs at least one block of at least one token");
  }
  uint64_t rows = 1;
  for (int64_t f : {num_blocks, block_size, config.num_kv_heads}) {
    if (!checked_mul(rows, static_cast<uint64_t>(f), &rows)) return resource_exhausted("KV cache size overflows");
  }
  uint64_t per_layer = 0;
  if (!checked_mul(rows, static_cast<uint64_t>(config.head_dim * kv_cache_elem_bytes(dtype)), &per_layer)) {
    return resource_exhausted("KV cache size overflows");
  }
  const uint64_t scale_bytes = dtype == KvCacheDtype::kInt8 ? rows * sizeof(float) : 0;
  KvCacheTensors kv;
  kv.num_blocks_ = num_blocks;
  kv.block_size_ = block_size;
  kv.num_kv_heads_ = config.num_kv_heads;
  kv.head_dim_ = config.head_dim;
  kv.dtype_ = dtype;
  try {
    for (int64_t i = 0; i < config.num_layers; ++i) {
      kv.keys_.push_back(kernels.allocate(per_layer));
      kv.values_.push_back(kernels.allocate(per_layer));
      if (scale_bytes > 0) {
        kv.key_scales_.push_back(kernels.allocate(scale_bytes));
        kv.value_scales_.push_back(kernels.allocate(scale_bytes));
      }
    }
  } catch (const std::bad_alloc&) {
    return resource_exhausted("cannot allocate a KV cache of " +
                              std::to_string(2 * (per_layer + scale_bytes) * config.num_layers) + " bytes");
  }
  return kv;
}

template <class F>
void KvCacheTensors::for_each_piece(BlockId block, F&& f) const {
  PAGODA_CHECK(block >= 0 && block < num_blocks_);
  const int64_t rows = block_size_ * num_kv_heads_;
  const int64_t data = rows * head_dim_ * kv_cache_elem_bytes(dtype_);
  const int64_t scales = dtype_ == KvCacheDtype::kInt8 ? rows * static_cast<int64_t>(sizeof(float)) : 0;
  for (size_t i = 0; i < keys_.size(); ++i) {
    f(static_cast<uint8_t*>(keys_[i].data()) + block * data, data);
    f(static_cast<uint8_t*>(values_[i].data()) + block * data, data);
    if (scales > 0) {
      f(static_cast<uint8_t*>(key_scales_[i].data()) + block * scales, scales);
      f(static_cast<uint8_t*>(value_scales_[i].data()) + block * scales, scales);
    }
  }
}

int64_t KvCacheTensors::block_bytes() const {
  if (num_blocks_ == 0) return 0;
  int64_t total = 0;
  for_each_piece(0, [&](uint8_t*, int64_t bytes) { total += bytes; });
  return total;
}

void KvCacheTensors::copy_block_to_host(const Kernels& kernels, BlockId block, uint8_t* dst) const {
  for_each_piece(block, [&](uint8_t* piece, int64_t bytes) {
    kernels.copy_to_host(dst, piece, static_cast<size_t>(bytes));
    dst += bytes;
  });
}

void KvCacheTensors::copy_block_from_host(const Kernels& kernels, BlockId block, const uint8_t* src) const {
  for_each_piece(block, [&](uint8_t* piece, int64_t bytes) {
    kernels.copy_to_device(piece, src, static_cast<size_t>(bytes));
    src += bytes;
  });
}

KvLayerView KvCacheTensors::layer(int64_t i) const {
  KvLayerView v{keys_[i].data(), values_[i].data(), num_blocks_, block_size_, num_kv_heads_, head_dim_, dtype_};
  if (dtype_ == KvCacheDtype::kInt8) {
    v.key_scales = key_scales_[i].as<float>();
    v.value_scales = value_scales_[i].as<float>();
  }
  return v;
}

}  // namespace pagoda
