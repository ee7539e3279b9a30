#include "model/kv_cache.h"

#include <new>

#include "base/checked_math.h"

namespace pagoda {

int64_t KvCacheTensors::bytes_per_block(const ModelConfig& c, int64_t block_size) {
  return 2 * c.num_layers * block_size * c.num_kv_heads * c.head_dim * static_cast<int64_t>(sizeof(float));
}

Result<KvCacheTensors> KvCacheTensors::allocate(const ModelConfig& config, int64_t num_blocks,
                                                int64_t block_size) {
  if (num_blocks <= 0 || block_size <= 0) {
    return invalid_argument("KV cache needs at least one block of at least one token");
  }
  uint64_t per_layer = 1;
  for (int64_t f : {num_blocks, block_size, config.num_kv_heads, config.head_dim,
                    static_cast<int64_t>(sizeof(float))}) {
    if (!checked_mul(per_layer, static_cast<uint64_t>(f), &per_layer)) {
      return resource_exhausted("KV cache size overflows");
    }
  }
  KvCacheTensors kv;
  kv.num_blocks_ = num_blocks;
  kv.block_size_ = block_size;
  kv.num_kv_heads_ = config.num_kv_heads;
  kv.head_dim_ = config.head_dim;
  try {
    for (int64_t i = 0; i < config.num_layers; ++i) {
      kv.keys_.emplace_back(per_layer);
      kv.values_.emplace_back(per_layer);
    }
  } catch (const std::bad_alloc&) {
    return resource_exhausted("cannot allocate a KV cache of " +
                              std::to_string(2 * per_layer * config.num_layers) + " bytes");
  }
  return kv;
}

KvLayerView KvCacheTensors::layer(int64_t i) const {
  return KvLayerView{keys_[i].as<float>(), values_[i].as<float>(), num_blocks_, block_size_,
                     num_kv_heads_, head_dim_};
}

}  // namespace pagoda
