// Scalar conversions between f32 and every storage DType, one row at a time: the definition of
// each format (the CPU backend's fast kernels are checked against these). Rows of quantized
// types hold a whole number of blocks. The generic entries dispatch through the DType traits
// table; the per-type functions below are its rows for the plain types, Q8_0 and Q4_0 (the other
// block types are in tensor/gguf_blocks.h and tensor/gguf_quantize.h).
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace pagoda {

// out[0..n) = the values of `n` elements of type t at `src`.
void dequantize_row(DType t, const void* src, float* out, int64_t n);

// Stores `n` f32 values as type t at `dst` (round to nearest; Q8_0/Q4_0 pick the block scale
// from the largest magnitude, as GGUF's reference quantizer does).
void quantize_row(DType t, const float* src, void* dst, int64_t n);

void dequantize_row_f32(const void* src, float* out, int64_t n);
void dequantize_row_f16(const void* src, float* out, int64_t n);
void dequantize_row_bf16(const void* src, float* out, int64_t n);
void dequantize_row_q8_0(const void* src, float* out, int64_t n);
void dequantize_row_q4_0(const void* src, float* out, int64_t n);
void quantize_row_f32(const float* src, void* dst, int64_t n);
void quantize_row_f16(const float* src, void* dst, int64_t n);
void quantize_row_bf16(const float* src, void* dst, int64_t n);
void quantize_row_q8_0(const float* src, void* dst, int64_t n);
void quantize_row_q4_0(const float* src, void* dst, int64_t n);
void dequantize_row_i8(const void* src, float* out, int64_t n);   // the codes as values
void quantize_row_i8(const float* src, void* dst, int64_t n);     // rounded to even, saturated to [-128, 127]
void dequantize_row_i32(const void* src, float* out, int64_t n);  // little-endian, any alignment
void quantize_row_i32(const float* src, void* dst, int64_t n);    // rounded to even, saturated
void dequantize_row_i64(const void* src, float* out, int64_t n);
void quantize_row_i64(const float* src, void* dst, int64_t n);

struct BlockQ8Act;
// Quantizes `n` f32 activations (n % 32 == 0) into n / 32 blocks as BlockQ8Act defines
// (tensor/quant_blocks.h). Finite inputs only.
void quantize_activation_row(const float* src, BlockQ8Act* dst, int64_t n);

// Quantizes one activation row of k values to int8 for an IntWeight product (backend/kernels.h):
// with static_scale > 0, q = x * (1 / static_scale), else q = x * (127 / max|x|); rounded to
// nearest even, saturated to [-127, 127]. Returns the row's scale s (static_scale, or max|x| /
// 127; 0 for an all-zero row, whose codes are 0). Finite inputs only.
float quantize_activation_row_int8(const float* x, int64_t k, float static_scale, int8_t* q);

// Quantizes one weight row of k values symmetrically to integer codes, as --quantization w8a8 /
// w4a8 and pagoda quantize do: per group of `group` columns (group divides k) scale = max|w| / 127
// (bits 8) or / 7 (bits 4), written to scales[k / group]; code = round-to-nearest-even(w * (qmax /
// max|w|)) clamped to [-qmax, qmax] (0 in an all-zero group), one int8 per element in codes[k].
void quantize_weight_row_symmetric(const float* w, int64_t k, int bits, int64_t group, int8_t* codes, float* scales);

// The int4 code of element t of a row of packed int4 codes (IntWeight's row-major layout).
inline int int4_code(const uint8_t* row, int64_t t) {
  const int nibble = (row[t / 2] >> (4 * (t % 2))) & 0xF;
  return nibble >= 8 ? nibble - 16 : nibble;
}

}  // namespace pagoda
