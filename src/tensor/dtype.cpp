#include "tensor/dtype.h"

#include <cstddef>

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
    {.type = DType::kF32, .name = "f32", .block_elems = 1, .block_bytes = 4, .ggml_type = 0,
     .dequantize_row = dequantize_row_f32, .quantize_row = quantize_row_f32, .safetensors_name = "F32"},
    {.type = DType::kF16, .name = "f16", .block_elems = 1, .block_bytes = 2, .ggml_type = 1,
     .dequantize_row = dequantize_row_f16, .quantize_row = quantize_row_f16, .safetensors_name = "F16"},
    {.type = DType::kBF16, .name = "bf16", .block_elems = 1, .block_bytes = 2, .ggml_type = 30,
     .dequantize_row = dequantize_row_bf16, .quantize_row = quantize_row_bf16, .safetensors_name = "BF16"},
    {.type = DType::kQ8_0, .name = "q8_0", .block_elems = 32, .block_bytes = sizeof(BlockQ8_0), .ggml_type = 8,
     .dequantize_row = dequantize_row_q8_0, .quantize_row = quantize_row_q8_0, .decode_chunks = decode_chunks_q8_0,
     .code_lo = -128, .code_hi = 127, .set_code = set_code_q8_0, .scale_offset = offsetof(BlockQ8_0, d)},
    {.type = DType::kQ4_0, .name = "q4_0", .block_elems = 32, .block_bytes = sizeof(BlockQ4_0), .ggml_type = 2,
     .dequantize_row = dequantize_row_q4_0, .quantize_row = quantize_row_q4_0, .decode_chunks = decode_chunks_q4_0,
     .code_lo = -8, .code_hi = 7, .set_code = set_code_q4_0, .scale_offset = offsetof(BlockQ4_0, d)},
    {.type = DType::kQ4_1, .name = "q4_1", .block_elems = 32, .block_bytes = sizeof(BlockQ4_1), .ggml_type = 3,
     .dequantize_row = dequantize_row_q4_1, .quantize_row = quantize_row_q4_1, .decode_chunks = decode_chunks_q4_1,
     .has_mins = true, .code_lo = 0, .code_hi = 15, .set_code = set_code_q4_1,
     .affine_d_offset = offsetof(BlockQ4_1, d), .affine_m_offset = offsetof(BlockQ4_1, m)},
    {.type = DType::kQ5_0, .name = "q5_0", .block_elems = 32, .block_bytes = sizeof(BlockQ5_0), .ggml_type = 6,
     .dequantize_row = dequantize_row_q5_0, .quantize_row = quantize_row_q5_0, .decode_chunks = decode_chunks_q5_0,
     .code_lo = -16, .code_hi = 15, .set_code = set_code_q5_0, .scale_offset = offsetof(BlockQ5_0, d)},
    {.type = DType::kQ5_1, .name = "q5_1", .block_elems = 32, .block_bytes = sizeof(BlockQ5_1), .ggml_type = 7,
     .dequantize_row = dequantize_row_q5_1, .quantize_row = quantize_row_q5_1, .decode_chunks = decode_chunks_q5_1,
     .has_mins = true, .code_lo = 0, .code_hi = 31, .set_code = set_code_q5_1,
     .affine_d_offset = offsetof(BlockQ5_1, d), .affine_m_offset = offsetof(BlockQ5_1, m)},
    {.type = DType::kQ2_K, .name = "q2_k", .block_elems = kSuperBlock, .block_bytes = sizeof(BlockQ2_K), .ggml_type = 10,
     .dequantize_row = dequantize_row_q2_k, .quantize_row = quantize_row_q2_k, .decode_chunks = decode_chunks_q2_k,
     .has_mins = true, .row_fallback = DType::kQ4_0, .code_lo = 0, .code_hi = 3, .set_code = set_code_q2_k},
    {.type = DType::kQ3_K, .name = "q3_k", .block_elems = kSuperBlock, .block_bytes = sizeof(BlockQ3_K), .ggml_type = 11,
     .dequantize_row = dequantize_row_q3_k, .quantize_row = quantize_row_q3_k, .decode_chunks = decode_chunks_q3_k,
     .row_fallback = DType::kQ4_0, .code_lo = -4, .code_hi = 3, .set_code = set_code_q3_k},
    {.type = DType::kQ4_K, .name = "q4_k", .block_elems = kSuperBlock, .block_bytes = sizeof(BlockQ4_K), .ggml_type = 12,
     .dequantize_row = dequantize_row_q4_k, .quantize_row = quantize_row_q4_k, .decode_chunks = decode_chunks_q4_k,
     .has_mins = true, .row_fallback = DType::kQ5_0, .code_lo = 0, .code_hi = 15, .set_code = set_code_q4_k},
    {.type = DType::kQ5_K, .name = "q5_k", .block_elems = kSuperBlock, .block_bytes = sizeof(BlockQ5_K), .ggml_type = 13,
     .dequantize_row = dequantize_row_q5_k, .quantize_row = quantize_row_q5_k, .decode_chunks = decode_chunks_q5_k,
     .has_mins = true, .row_fallback = DType::kQ5_1, .code_lo = 0, .code_hi = 31, .set_code = set_code_q5_k},
    {.type = DType::kQ6_K, .name = "q6_k", .block_elems = kSuperBlock, .block_bytes = sizeof(BlockQ6_K), .ggml_type = 14,
     .dequantize_row = dequantize_row_q6_k, .quantize_row = quantize_row_q6_k, .decode_chunks = decode_chunks_q6_k,
     .row_fallback = DType::kQ8_0, .code_lo = -32, .code_hi = 31, .set_code = set_code_q6_k},
    {.type = DType::kI8, .name = "i8", .block_elems = 1, .block_bytes = 1, .ggml_type = 24,
     .dequantize_row = dequantize_row_i8, .quantize_row = quantize_row_i8, .dense_matmul = false,
     .safetensors_name = "I8"},
    {.type = DType::kI32, .name = "i32", .block_elems = 1, .block_bytes = 4, .ggml_type = 26,
     .dequantize_row = dequantize_row_i32, .quantize_row = quantize_row_i32, .dense_matmul = false,
     .safetensors_name = "I32"},
    {.type = DType::kI64, .name = "i64", .block_elems = 1, .block_bytes = 8, .ggml_type = 27,
     .dequantize_row = dequantize_row_i64, .quantize_row = quantize_row_i64, .dense_matmul = false,
     .safetensors_name = "I64"},
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

DType dtype_for_rows(DType t, int64_t row_len) {
  while (row_len % block_elems(t) != 0) t = dtype_traits(t).row_fallback;
  return t;
}

}  // namespace pagoda
