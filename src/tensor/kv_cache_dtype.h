// KvCacheDtype: the element types the paged KV cache can hold, named as vLLM names them. The
// engine's configuration picks one; the backend lays the cache out in it (backend/kernels.h).
#pragma once

#include <cstdint>
#include <string_view>

namespace pagoda {

// The element type of the paged KV cache (--kv-cache-dtype; vLLM's names in kv_cache_dtype_name):
// f32, f16, bf16, the two fp8 formats of tensor/fp8.h, or int8 with one f32 scale per token and
// head (element = scale * code; scale = max |x| / 127 over the head's row, codes rounded to
// nearest even).
enum class KvCacheDtype : uint8_t { kF32, kF16, kBF16, kFp8E4M3, kFp8E5M2, kInt8 };

constexpr std::string_view kv_cache_dtype_name(KvCacheDtype t) {
  constexpr std::string_view kNames[] = {"float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2", "int8"};
  return kNames[static_cast<int>(t)];
}

constexpr int64_t kv_cache_elem_bytes(KvCacheDtype t) {
  return t == KvCacheDtype::kF32 ? 4 : (t == KvCacheDtype::kF16 || t == KvCacheDtype::kBF16) ? 2 : 1;
}

}  // namespace pagoda
