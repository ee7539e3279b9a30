#include "backend/cpu/kv_rows.h"

#include <cmath>
#include <cstring>

#include "base/check.h"
#include "tensor/fp8.h"
#include "tensor/half.h"

namespace pagoda::cpu {
namespace {

int64_t row_index(const KvLayerView& c, int64_t slot, int64_t kv_head) {
  PAGODA_CHECK(slot >= 0 && slot < c.num_blocks * c.block_size && kv_head >= 0 && kv_head < c.num_kv_heads);
  return slot * c.num_kv_heads + kv_head;
}

}  // namespace

void read_kv_row(const KvLayerView& c, bool value, int64_t slot, int64_t kv_head, float* out) {
  const int64_t row = row_index(c, slot, kv_head), hd = c.head_dim;
  const void* base = value ? c.value : c.key;
  const int64_t offset = row * hd;
  switch (c.dtype) {
    case KvCacheDtype::kF32:
      std::memcpy(out, static_cast<const float*>(base) + offset, static_cast<size_t>(hd) * 4);
      return;
    case KvCacheDtype::kF16: {
      const auto* p = static_cast<const uint16_t*>(base) + offset;
      for (int64_t d = 0; d < hd; ++d) out[d] = fp16_to_f32(p[d]);
      return;
    }
    case KvCacheDtype::kBF16: {
      const auto* p = static_cast<const uint16_t*>(base) + offset;
      for (int64_t d = 0; d < hd; ++d) out[d] = bf16_to_f32(p[d]);
      return;
    }
    case KvCacheDtype::kFp8E4M3:
    case KvCacheDtype::kFp8E5M2: {
      const float* table = c.dtype == KvCacheDtype::kFp8E4M3 ? fp8_e4m3_table() : fp8_e5m2_table();
      const auto* p = static_cast<const uint8_t*>(base) + offset;
      for (int64_t d = 0; d < hd; ++d) out[d] = table[p[d]];
      return;
    }
    case KvCacheDtype::kInt8: {
      const auto* p = static_cast<const int8_t*>(base) + offset;
      const float scale = (value ? c.value_scales : c.key_scales)[row];
      for (int64_t d = 0; d < hd; ++d) out[d] = scale * static_cast<float>(p[d]);
      return;
    }
  }
}

void write_kv_row(const KvLayerView& c, bool value, int64_t slot, int64_t kv_head, const float* in) {
  const int64_t row = row_index(c, slot, kv_head), hd = c.head_dim;
  void* base = value ? c.value : c.key;
  const int64_t offset = row * hd;
  switch (c.dtype) {
    case KvCacheDtype::kF32:
      std::memcpy(static_cast<float*>(base) + offset, in, static_cast<size_t>(hd) * 4);
      return;
    case KvCacheDtype::kF16: {
      auto* p = static_cast<uint16_t*>(base) + offset;
      for (int64_t d = 0; d < hd; ++d) p[d] = f32_to_fp16(in[d]);
      return;
    }
    case KvCacheDtype::kBF16: {
      auto* p = static_cast<uint16_t*>(base) + offset;
      for (int64_t d = 0; d < hd; ++d) p[d] = f32_to_bf16(in[d]);
      return;
    }
    case KvCacheDtype::kFp8E4M3: {
      auto* p = static_cast<uint8_t*>(base) + offset;
      for (int64_t d = 0; d < hd; ++d) p[d] = f32_to_fp8_e4m3(in[d]);
      return;
    }
    case KvCacheDtype::kFp8E5M2: {
      auto* p = static_cast<uint8_t*>(base) + offset;
      for (int64_t d = 0; d < hd; ++d) p[d] = f32_to_fp8_e5m2(in[d]);
      return;
    }
    case KvCacheDtype::kInt8: {
      auto* p = static_cast<int8_t*>(base) + offset;
      float amax = 0;
      for (int64_t d = 0; d < hd; ++d) amax = std::fmax(amax, std::fabs(in[d]));
      const float inv = amax != 0 ? 127.0f / amax : 0.0f;
      (value ? c.value_scales : c.key_scales)[row] = amax / 127.0f;
      for (int64_t d = 0; d < hd; ++d) p[d] = static_cast<int8_t>(std::nearbyint(in[d] * inv));
      return;
    }
  }
}

}  // namespace pagoda::cpu
