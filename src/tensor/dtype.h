// DType: the element types a weight or activation can have, and the table of their traits.
//
// Quantized types are stored in blocks: `block_elems` elements take `block_bytes` bytes. Plain
// types have block_elems == 1. The quantized types are GGUF's block types, byte for byte
// (tensor/quant_blocks.h, tensor/gguf_blocks.h). Everything that differs between types is a row
// of the traits table (dtype_traits): code asks the table instead of switching on the enum, so a
// new type is one new row. The table is constant: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace pagoda {

enum class DType : uint8_t {
  kF32, kF16, kBF16,
  kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1,    // 32-element blocks
  kQ2_K, kQ3_K, kQ4_K, kQ5_K, kQ6_K,    // 256-element super-blocks (ggml's K-quants)
  kI8,                                  // bare int8 codes (W8A8 checkpoints' weights; scales apart)
  kI32, kI64,                           // plain integers: packed int4/int8 codes (AWQ, GPTQ,
                                        // compressed-tensors pack-quantized), g_idx, shapes
};

struct QuantChunk;

struct DTypeTraits {
  DType type;
  std::string_view name;  // "f32", "q4_k", ...: --dtype values and log lines
  int64_t block_elems;
  int64_t block_bytes;
  uint32_t ggml_type;     // the GGUF tensor type id
  // n elements (a whole number of blocks) of one row at src -> f32.
  void (*dequantize_row)(const void* src, float* out, int64_t n);
  // n f32 values -> n elements of this type at dst (round to nearest; the quantized types choose
  // their scales as tensor/gguf_quantize.h says). Every type has one.
  void (*quantize_row)(const float* src, void* dst, int64_t n);
  // Quantized types only (nullptr for plain ones): one block at src -> block_elems / 32 chunks
  // in the integer form of QuantChunk, which the int8 matmuls compute with.
  void (*decode_chunks)(const void* block, QuantChunk* out) = nullptr;
  // Whether decode_chunks can give chunks a non-zero dmin (types with a per-block minimum or
  // offset: q4_1, q5_1, q2_k, q4_k, q5_k). Types without skip that term of the product.
  bool has_mins = false;
  // Whether a weight of this type is a matrix on its own (Kernels::matmul multiplies it): every
  // type but the integer ones, whose codes mean something only with their scales
  // (model/quant/quant_method.h).
  bool dense_matmul = true;
  // safetensors' name of the type ("F32", "BF16", "I8", ...); "" for GGUF's block types.
  std::string_view safetensors_name = "";
  // Block types: what a row that is not a whole number of blocks gets instead, as llama-quantize
  // writes it (a K-quant: a 32-element type; a 32-element type: f16). See dtype_for_rows.
  DType row_fallback = DType::kF16;
  // Block types, element by element (what GPTQ rounds with, tools/quantize/gptq.h): the codes an
  // element may hold, in QuantChunk's convention, and how one is stored into a block, clearing
  // what the element held (the inverse of decode_chunks).
  int code_lo = 0, code_hi = 0;
  void (*set_code)(uint8_t* block, int e, int q) = nullptr;
  // Where a block keeps the scales its quantizer alone chooses: the one f16 d of q8_0, q4_0 and
  // q5_0 (-1 for the others); for q4_1 and q5_1, whose value is d * q + m, d and m (-1 otherwise).
  int16_t scale_offset = -1;
  int16_t affine_d_offset = -1, affine_m_offset = -1;
};

// The row of t. Every DType has one.
const DTypeTraits& dtype_traits(DType t);
// Every type, in enum order.
std::span<const DTypeTraits> all_dtypes();

std::string_view dtype_name(DType t);
std::optional<DType> dtype_from_name(std::string_view name);  // inverse of dtype_name
std::optional<DType> dtype_from_ggml_type(uint32_t ggml_type);
int64_t block_elems(DType t);
int64_t block_bytes(DType t);
bool is_quantized(DType t);  // stored in blocks of more than one element

// t where rows of row_len elements are whole blocks of it, else (repeatedly) its row_fallback:
// the type llama-quantize gives such a row.
DType dtype_for_rows(DType t, int64_t row_len);

// Bytes of `num_elems` elements of type t, or nullopt when num_elems is not a whole number of
// blocks or the size overflows.
std::optional<uint64_t> dtype_bytes(DType t, uint64_t num_elems);

}  // namespace pagoda
