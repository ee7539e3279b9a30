// The GGUF block layouts of Q8_0 and Q4_0 (ggml's block_q8_0 and block_q4_0; the other block
// types are in tensor/gguf_blocks.h), the block activations are quantized to for products with
// quantized weights, and the integer form every quantized type decodes to for those products.
//
// Q8_0: 32 values x_i = d * q_i, q_i int8.
// Q4_0: 32 values x_i = d * (n_i - 8), n_i in [0, 15]; byte j holds n_j in its low nibble and
//       n_{j+16} in its high nibble.
#pragma once

#include <cstdint>

namespace pagoda {

inline constexpr int kQuantBlock = 32;

struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQuantBlock];
};
static_assert(sizeof(BlockQ8_0) == 34);

struct BlockQ4_0 {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQuantBlock / 2];
};
static_assert(sizeof(BlockQ4_0) == 18);

// An activation (f32) row quantized for the int8 dot products of Q8_0/Q4_0 matmuls: 32 values
// x_i ~ d * q_i with d = max|x| / 127 in f32 and q_i = x_i * (127 / max|x|) rounded to nearest
// even (all zero when max|x| is 0). Each output of such a matmul is then
// sum over blocks of d_w * d_x * (exact integer dot of the block's q's).
struct BlockQ8Act {
  float d;
  int8_t qs[kQuantBlock];
};
static_assert(sizeof(BlockQ8Act) == 36);

// 32 consecutive elements of a quantized row (one Q8_0 / Q4_0 / Q4_1 / Q5_x block, or an eighth
// of a K-quant super-block) in integer form: element i is
//   w_i = d * sc[i / 16] * q[i] - dmin * mn[i / 16]
// evaluated as (d * sc) * q - (dmin * mn) in f32, which is exactly what the type's dequantizer
// gives. Types whose sub-blocks are 32 long have sc[0] == sc[1] and mn[0] == mn[1]; Q4_1 / Q5_1
// write their offset m as dmin = -m with mn = 1; types without an offset have dmin = 0, mn = 0.
//
// A quantized matmul multiplies a chunk by an activation block (d_x, qx) as integers:
//   I = sc[0] * sum_{i<16} q_i qx_i + sc[1] * sum_{i>=16} q_i qx_i
//   M = mn[0] * sum_{i<16} qx_i + mn[1] * sum_{i>=16} qx_i
//   acc = acc + float(I) * (d * d_x);  then, for types with mins, acc = acc - float(M) * (dmin * d_x)
// (f32, that order; exact integers: |I| < 2^31 for every type). For Q8_0 / Q4_0 that is
// acc + float(dot) * (d * d_x), the product their kernels always computed.
struct QuantChunk {
  float d = 0, dmin = 0;
  int32_t sc[2] = {0, 0}, mn[2] = {0, 0};
  int8_t q[kQuantBlock] = {};
};

}  // namespace pagoda
