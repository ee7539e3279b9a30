// DType: the element types a weight or activation can have, and their storage geometry.
//
// Quantized types are stored in blocks: `block_elems(t)` elements take `block_bytes(t)` bytes.
// Plain types have block_elems == 1. The block layouts match GGUF's (see tensor/quant_blocks.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace pagoda {

enum class DType : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0 };

std::string_view dtype_name(DType t);  // "f32", "f16", "bf16", "q8_0", "q4_0"
std::optional<DType> dtype_from_name(std::string_view name);  // inverse of dtype_name
int64_t block_elems(DType t);
int64_t block_bytes(DType t);
bool is_quantized(DType t);

// Bytes of `num_elems` elements of type t, or nullopt when num_elems is not a whole number of
// blocks or the size overflows.
std::optional<uint64_t> dtype_bytes(DType t, uint64_t num_elems);

}  // namespace pagoda
