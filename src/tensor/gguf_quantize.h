// Quantizers for the GGUF block types of tensor/gguf_blocks.h: n f32 values of one row (a whole
// number of blocks) -> blocks. Round to nearest with one pass of scale choice per (sub-)block:
//  - Q4_1 / Q5_1: the block's minimum is the offset m, its range / (2^bits - 1) the scale.
//  - Q5_0: as Q4_0, the value of largest magnitude maps to the most negative code (-16).
//  - Q4_K / Q5_K / Q2_K: each sub-block's scale and offset as Q4_1's, with the offset's minimum
//    clipped at 0 (codes are unsigned); the super-block's d and dmin make the largest of them
//    63 (15 for Q2_K), and the codes are then chosen against the rounded scales.
//  - Q3_K / Q6_K: symmetric, each sub-block's largest magnitude on the most negative code, the
//    6-bit (Q3_K) or int8 (Q6_K) sub-block scales relative to d.
// llama.cpp's quantizers search scales iteratively and reach lower error; these are the simple,
// exact-to-spec baseline (docs/quantization.md reports their accuracy). Pure; thread-safe.
#pragma once

#include <cstdint>

namespace pagoda {

void quantize_row_q4_1(const float* src, void* dst, int64_t n);
void quantize_row_q5_0(const float* src, void* dst, int64_t n);
void quantize_row_q5_1(const float* src, void* dst, int64_t n);
void quantize_row_q2_k(const float* src, void* dst, int64_t n);
void quantize_row_q3_k(const float* src, void* dst, int64_t n);
void quantize_row_q4_k(const float* src, void* dst, int64_t n);
void quantize_row_q5_k(const float* src, void* dst, int64_t n);
void quantize_row_q6_k(const float* src, void* dst, int64_t n);

}  // namespace pagoda
