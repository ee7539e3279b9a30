#include "tensor/dtype.h"

#include "base/checked_math.h"

namespace pagoda {

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kQ8_0: return "q8_0";
    case DType::kQ4_0: return "q4_0";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

int64_t block_elems(DType t) { return is_quantized(t) ? 32 : 1; }

int64_t block_bytes(DType t) {
  switch (t) {
    case DType::kF32: return 4;
    case DType::kF16: return 2;
    case DType::kBF16: return 2;
    case DType::kQ8_0: return 34;  // f16 scale + 32 x int8
    case DType::kQ4_0: return 18;  // f16 scale + 16 bytes of nibbles
  }
  return 0;
}

bool is_quantized(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0; }

std::optional<uint64_t> dtype_bytes(DType t, uint64_t num_elems) {
  uint64_t be = static_cast<uint64_t>(block_elems(t));
  if (num_elems % be != 0) return std::nullopt;
  uint64_t out;
  if (!checked_mul(num_elems / be, static_cast<uint64_t>(block_bytes(t)), &out)) return std::nullopt;
  return out;
}

}  // namespace pagoda
