#include "tensor/dtype.h"

#include "base/check.h"
#include "base/checked_math.h"
#include "tensor/convert.h"
#include "tensor/gguf_blocks.h"
#include "tensor/gguf_quantize.h"
#include "tensor/quant_blocks.h"

namespace pagoda {
namespace {

// In enum order (dtype_traits indexes it by the enum's value; a static_assert below keeps the
// two in step).
constexpr DTypeTraits kTraits[] = {
    {DType::kF32, "f32", 1, 4, 0, dequantize_row_f32, quantize_row_f32, nullptr, false},
    {DType::kF16, "f16", 1, 2, 1, dequantize_row_f16, quantize_row_f16, nullptr, false},
    {DType::kBF16, "bf16", 1, 2, 30, dequantize_row_bf16, quantize_row_bf16, nullptr, false},
    {DType::kQ8_0, "q8_0", 32, sizeof(BlockQ8_0), 8, dequantize_row_q8_0, quantize_row_q8_0, decode_chunks_q8_0, false},
    {DType::kQ4_0, "q4_0", 32, sizeof(BlockQ4_0), 2, dequantize_row_q4_0, quantize_row_q4_0, decode_chunks_q4_0, false},
    {DType::kQ4_1, "q4_1", 32, sizeof(BlockQ4_1), 3, dequantize_row_q4_1, quantize_row_q4_1, decode_chunks_q4_1, true},
    {DType::kQ5_0, "q5_0", 32, sizeof(BlockQ5_0), 6, dequantize_row_q5_0, quantize_row_q5_0, decode_chunks_q5_0, false},
    {DType::kQ5_1, "q5_1", 32, sizeof(BlockQ5_1), 7, dequantize_row_q5_1, quantize_row_q5_1, decode_chunks_q5_1, true},
    {DType::kQ2_K, "q2_k", kSuperBlock, sizeof(BlockQ2_K), 10, dequantize_row_q2_k, quantize_row_q2_k, decode_chunks_q2_k, true},
    {DType::kQ3_K, "q3_k", kSuperBlock, sizeof(BlockQ3_K), 11, dequantize_row_q3_k, quantize_row_q3_k, decode_chunks_q3_k, false},
    {DType::kQ4_K, "q4_k", kSuperBlock, sizeof(BlockQ4_K), 12, dequantize_row_q4_k, quantize_row_q4_k, decode_chunks_q4_k, true},
    {DType::kQ5_K, "q5_k", kSuperBlock, sizeof(BlockQ5_K), 13, dequantize_row_q5_k, quantize_row_q5_k, decode_chunks_q5_k, true},
    {DType::kQ6_K, "q6_k", kSuperBlock, sizeof(BlockQ6_K), 14, dequantize_row_q6_k, quantize_row_q6_k, decode_chunks_q6_k, false},
    {DType::kI8, "i8", 1, 1, 24, dequantize_row_i8, quantize_row_i8, nullptr, false, /*dense_matmul=*/false},
    {DType::kI32, "i32", 1, 4, 26, dequantize_row_i32, quantize_row_i32, nullptr, false, /*dense_matmul=*/false},
    {DType::kI64, "i64", 1, 8, 27, dequantize_row_i64, quantize_row_i64, nullptr, false, /*dense_matmul=*/false},
};

constexpr bool table_in_enum_order() {
  for (size_t i = 0; i < std::size(kTraits); ++i) {
    if (static_cast<size_t>(kTraits[i].type) != i) return false;
  }
  return static_cast<size_t>(DType::kI64) + 1 == std::size(kTraits);
}
static_assert(table_in_enum_order());

}  // namespace

const DTypeTraits& dtype_traits(DType t) {
  const auto i = static_cast<size_t>(t);
  PAGODA_CHECK(i < std::size(kTraits));
  return kTraits[i];
}

std::span<const DTypeTraits> all_dtypes() { return kTraits; }

std::string_view dtype_name(DType t) { return dtype_traits(t).name; }

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const DTypeTraits& t : kTraits) {
    if (t.name == name) return t.type;
  }
  return std::nullopt;
}

std::optional<DType> dtype_from_ggml_type(uint32_t ggml_type) {
  for (const DTypeTraits& t : kTraits) {
    if (t.ggml_type == ggml_type) return t.type;
  }
  return std::nullopt;
}

int64_t block_elems(DType t) { return dtype_traits(t).block_elems; }
int64_t block_bytes(DType t) { return dtype_traits(t).block_bytes; }
bool is_quantized(DType t) { return dtype_traits(t).block_elems > 1; }

std::optional<uint64_t> dtype_bytes(DType t, uint64_t num_elems) {
  uint64_t be = static_cast<uint64_t>(block_elems(t));
  if (num_elems % be != 0) return std::nullopt;
  uint64_t out;
  if (!checked_mul(num_elems / be, static_cast<uint64_t>(block_bytes(t)), &out)) return std::nullopt;
  return out;
}

}  // namespace pagoda
