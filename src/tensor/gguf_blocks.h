// The GGUF block types beyond Q8_0 / Q4_0 that llama.cpp's files carry: the 32-element legacy
// blocks Q4_1, Q5_0, Q5_1 and the 256-element K-quant super-blocks Q2_K ... Q6_K (Q4_K_M files
// are mostly Q4_K with Q6_K output and some Q6_K / Q5_K layers). Layouts are ggml's, byte for
// byte (shared/docs/quantization-formats.md sections 1.3 and 1.4); every struct is packed, its
// fp16 fields only 2-byte aligned, so blocks are read from file bytes with memcpy.
//
// Each type has a row decoder to f32 and a block decoder to the integer chunks of
// tensor/quant_blocks.h (the form the int8 matmuls compute with); both are rows of the DType
// traits table. Pure functions; thread-safe.
#pragma once

#include <cstdint>

namespace pagoda {

struct QuantChunk;

inline constexpr int kSuperBlock = 256;  // ggml's QK_K

// Q4_1: 32 values w_i = d * n_i + m, n_i in [0, 15], nibbles as Q4_0 (byte j: n_j low, n_{j+16} high).
struct BlockQ4_1 {
  uint16_t d, m;  // fp16
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

// Q5_0: 32 values w_i = d * (v_i - 16), v_i = nibble | (bit i of qh) << 4.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];  // little-endian uint32: bit i is element i's fifth bit
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);

// Q5_1: 32 values w_i = d * v_i + m, v_i as Q5_0.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// Q2_K: 16 sub-blocks of 16; w = d * sc * q - dmin * mn, q in [0, 3], (sc, mn) the nibbles of
// scales[i / 16].
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// Q3_K: 16 sub-blocks of 16; w = d * sc * q, q in [-4, 3] (a clear hmask bit subtracts 4), sc a
// 6-bit scale stored + 32.
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// Q4_K: 8 sub-blocks of 32; w = d * sc * q - dmin * mn, q in [0, 15], 6-bit (sc, mn) packed in
// 12 bytes.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);

// Q5_K: as Q4_K with a fifth bit per element in qh: q in [0, 31].
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176);

// Q6_K: 16 sub-blocks of 16; w = d * scales[i / 16] * q, q in [-32, 31] from 4 low bits (ql) and
// 2 high bits (qh).
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Row decoders: `src` holds n / block elements blocks (n a multiple of 32, or of 256 for the
// K-quants; a bug otherwise), `out` n floats.
void dequantize_row_q4_1(const void* src, float* out, int64_t n);
void dequantize_row_q5_0(const void* src, float* out, int64_t n);
void dequantize_row_q5_1(const void* src, float* out, int64_t n);
void dequantize_row_q2_k(const void* src, float* out, int64_t n);
void dequantize_row_q3_k(const void* src, float* out, int64_t n);
void dequantize_row_q4_k(const void* src, float* out, int64_t n);
void dequantize_row_q5_k(const void* src, float* out, int64_t n);
void dequantize_row_q6_k(const void* src, float* out, int64_t n);

// Block decoders: one block at `block` -> its 32-element chunks in order (1 for the 32-element
// types, 8 for the K-quants). Dequantizing a chunk as QuantChunk says gives exactly the row
// decoder's values.
// Element e of a block set to code q (QuantChunk's convention: the values decode_chunks gives),
// clearing what the element held: the inverse of decode_chunks, element by element.
void set_code_q8_0(uint8_t* block, int e, int q);
void set_code_q4_0(uint8_t* block, int e, int q);
void set_code_q4_1(uint8_t* block, int e, int q);
void set_code_q5_0(uint8_t* block, int e, int q);
void set_code_q5_1(uint8_t* block, int e, int q);
void set_code_q2_k(uint8_t* block, int e, int q);
void set_code_q3_k(uint8_t* block, int e, int q);
void set_code_q4_k(uint8_t* block, int e, int q);
void set_code_q5_k(uint8_t* block, int e, int q);
void set_code_q6_k(uint8_t* block, int e, int q);

void decode_chunks_q8_0(const void* block, QuantChunk* out);
void decode_chunks_q4_0(const void* block, QuantChunk* out);
void decode_chunks_q4_1(const void* block, QuantChunk* out);
void decode_chunks_q5_0(const void* block, QuantChunk* out);
void decode_chunks_q5_1(const void* block, QuantChunk* out);
void decode_chunks_q2_k(const void* block, QuantChunk* out);
void decode_chunks_q3_k(const void* block, QuantChunk* out);
void decode_chunks_q4_k(const void* block, QuantChunk* out);
void decode_chunks_q5_k(const void* block, QuantChunk* out);
void decode_chunks_q6_k(const void* block, QuantChunk* out);

}  // namespace pagoda
