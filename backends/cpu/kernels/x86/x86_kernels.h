// The x86 SIMD kernels of the CPU backend. Each is checked against the reference kernels
// (kernels/reference) and chosen at start-up from cpu_features(); calling one on a CPU without
// its features is a bug (SIGILL). Stateless apart from the thread pool they are handed:
// thread-safe.
//
// Layout of the AVX2 matmul: matmul_avx2.cpp holds only the leaf loop (matmul_rows_avx2) and is
// the one file compiled with -mavx2 -mfma -mf16c. It deliberately uses no inline function or
// template from a shared header (no Tensor, std::vector, std::function, tensor/half.h): the
// out-of-line copy such a file emits would carry AVX2 instructions, and the linker may keep that
// copy for the whole program, which must run on CPUs without AVX2. The threading driver
// (matmul_avx2_driver.cpp) is baseline code.
#pragma once

#include <cstdint>

#include "tensor/dtype.h"

namespace pagoda {
struct Tensor;
class ThreadPool;
}  // namespace pagoda

namespace pagoda::cpu {

// AVX2 + FMA + F16C. Computes y[i, j] = sum_t x[i, t] * w[j, t] for every i < m and every
// j in [row_begin, row_end): x is [m, k] f32; w is row j at w + j * w_row_bytes, k elements of
// w_type (f32, f16, bf16, q8_0, q4_0; quantized rows need k % 32 == 0); y is [m, ldy] f32.
// Runs on the calling thread.
void matmul_rows_avx2(const float* x, int64_t m, int64_t k, DType w_type, const void* w,
                      int64_t w_row_bytes, float* y, int64_t ldy, int64_t row_begin,
                      int64_t row_end);

// y[m, n] = x[m, k] * w[n, k]^T (the Kernels::matmul contract) with matmul_rows_avx2, the rows
// of w split over `pool` in chunks (pool == nullptr, or a small product: the calling thread only).
void matmul_avx2_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool);

// The Kernels::matmul entry: matmul_avx2_pooled over cpu_thread_pool().
void matmul_avx2(const float* x, int64_t m, const Tensor& w, float* y);

}  // namespace pagoda::cpu
