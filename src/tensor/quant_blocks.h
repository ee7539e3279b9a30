// The GGUF block layouts of the quantized types (ggml's block_q8_0 and block_q4_0), and the
// block the CPU backend quantizes activations to for products with them.
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

}  // namespace pagoda
