// The threading half of the AVX2 matmul, built with baseline flags (see x86_kernels.h for why it
// is apart from matmul_avx2.cpp).
#include <algorithm>
#include <vector>

#include "backends/cpu/cpu_thread_pool.h"
#include "backends/cpu/kernels/x86/x86_kernels.h"
#include "base/check.h"
#include "base/thread_pool.h"
#include "tensor/quant_blocks.h"
#include "tensor/tensor.h"

namespace pagoda::cpu {
namespace {
// Output rows per unit of parallel work: a multiple of the leaf's 16-row blocks, small enough
// that even a 64-row projection spreads over a few threads.
constexpr int64_t kRowsPerChunk = 16;
// Below this many multiply-adds (tens of microseconds of work) waking the workers costs more
// than it saves.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;
}  // namespace

void matmul_avx2_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool) {
  const int64_t n = w.num_rows();
  const int64_t k = w.row_len();
  if (m <= 0 || n <= 0) return;
  const int64_t w_row_bytes = w.row_bytes();
  const int64_t num_chunks = (n + kRowsPerChunk - 1) / kRowsPerChunk;
  const bool parallel = pool != nullptr && pool->num_threads() > 1 && num_chunks > 1 &&
                        m * n * k >= kMinParallelMacs;
  // Runs leaf(begin_row, end_row) over [0, n), split over the pool when worth it.
  auto split = [&](auto&& leaf) {
    if (!parallel) return leaf(0, n);
    pool->parallel_for(num_chunks, [&](int64_t begin, int64_t end) {
      leaf(begin * kRowsPerChunk, std::min(n, end * kRowsPerChunk));
    });
  };
  if (!is_quantized(w.dtype)) {
    split([&](int64_t j0, int64_t j1) {
      matmul_rows_avx2(x, m, k, w.dtype, w.data, w_row_bytes, y, n, j0, j1);
    });
    return;
  }
  PAGODA_CHECK(k % kQuantBlock == 0);
  // The activations, quantized once per call (split by rows when there are many) and shared by
  // every thread. One buffer per calling thread, reused: calls are per layer, sizes repeat.
  thread_local std::vector<BlockQ8Act> xq;
  const int64_t nb = k / kQuantBlock;
  xq.resize(static_cast<size_t>(m * nb));
  BlockQ8Act* xq_data = xq.data();
  if (parallel && m >= 2 * pool->num_threads()) {
    pool->parallel_for(m, [&](int64_t begin, int64_t end) {
      quantize_activation_rows_avx2(x + begin * k, end - begin, k, xq_data + begin * nb);
    });
  } else {
    quantize_activation_rows_avx2(x, m, k, xq_data);
  }
  split([&](int64_t j0, int64_t j1) {
    matmul_q8act_rows_avx2(xq_data, m, k, w.dtype, w.data, w_row_bytes, y, n, j0, j1);
  });
}

void matmul_avx2(const float* x, int64_t m, const Tensor& w, float* y) {
  matmul_avx2_pooled(x, m, w, y, &cpu_thread_pool());
}

}  // namespace pagoda::cpu
