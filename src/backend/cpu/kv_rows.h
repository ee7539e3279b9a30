// Reading and writing one (slot, kv head) row of a paged KV cache of any KvCacheDtype, in f32:
// the definition of each cache type for the CPU kernels (reference store_kv and attention, and the
// AVX2 attention's conversion of non-f32 caches). Baseline code; thread-safe on distinct rows.
#pragma once

#include <cstdint>

#include "backend/kernels.h"

namespace pagoda::cpu {

// out[0, head_dim) = the key (value: false) or value (true) row of `slot`, `kv_head`, as f32.
void read_kv_row(const KvLayerView& cache, bool value, int64_t slot, int64_t kv_head, float* out);

// Stores in[0, head_dim) as that row, converted to the cache's dtype.
void write_kv_row(const KvLayerView& cache, bool value, int64_t slot, int64_t kv_head, const float* in);

}  // namespace pagoda::cpu
