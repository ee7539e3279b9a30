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

// Below this many multiply-adds (tens of microseconds of work) waking the workers costs more
// than it saves.
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

// The activations quantized once per call (split by rows when there are many) and shared by every
// thread, with each block's sum when `with_sums`. One buffer per calling thread, reused: calls
// are per layer, sizes repeat.
struct QuantizedInput {
  const BlockQ8Act* blocks;
  const int32_t* sums;  // nullptr unless asked for
};

QuantizedInput quantize_input(const float* x, int64_t m, int64_t k, bool with_sums, bool parallel,
                              ThreadPool* pool) {
  PAGODA_CHECK(k % kQuantBlock == 0);
  thread_local std::vector<BlockQ8Act> xq;
  thread_local std::vector<int32_t> sums;
  const int64_t nb = k / kQuantBlock;
  xq.resize(static_cast<size_t>(m * nb));
  if (with_sums) sums.resize(static_cast<size_t>(m * nb));
  BlockQ8Act* xq_data = xq.data();
  int32_t* sums_data = with_sums ? sums.data() : nullptr;
  auto rows = [&](int64_t begin, int64_t end) {
    quantize_activation_rows_avx2(x + begin * k, end - begin, k, xq_data + begin * nb);
    if (with_sums) {
      activation_block_sums_avx2(xq_data + begin * nb, (end - begin) * nb, sums_data + begin * nb);
    }
  };
  if (parallel && m >= 2 * pool->num_threads()) {
    pool->parallel_for(m, rows);
  } else {
    rows(0, m);
  }
  return {xq_data, sums_data};
}

// The work is split by panels, kPanelsPerChunk (32 output rows) at a time: small enough that
// even a 256-row projection spreads over 8 chunks.
constexpr int64_t kPanelsPerChunk = 4;

void matmul_packed_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool) {
  const int64_t n = w.num_rows();
  const int64_t k = w.row_len();
  const int64_t num_panels = (n + kPanelRows - 1) / kPanelRows;
  const int64_t num_chunks = (num_panels + kPanelsPerChunk - 1) / kPanelsPerChunk;
  const bool parallel = pool != nullptr && pool->num_threads() > 1 && num_chunks > 1 &&
                        m * n * k >= kMinParallelMacs;
  auto split = [&](auto&& leaf) {
    if (!parallel) return leaf(0, num_panels);
    pool->parallel_for(num_chunks, [&](int64_t begin, int64_t end) {
      leaf(begin * kPanelsPerChunk, std::min(num_panels, end * kPanelsPerChunk));
    });
  };
  if (!is_quantized(w.dtype)) {
    split([&](int64_t p0, int64_t p1) {
      matmul_packed_rows_avx2(x, m, k, w.dtype, w.data, n, y, n, p0, p1);
    });
    return;
  }
  const QuantizedInput xq = quantize_input(x, m, k, w.dtype == DType::kQ4_0, parallel, pool);
  split([&](int64_t p0, int64_t p1) {
    matmul_packed_q8act_avx2(xq.blocks, xq.sums, m, k, w.dtype, w.data, n, y, n, p0, p1);
  });
}

}  // namespace

void matmul_avx2_pooled(const float* x, int64_t m, const Tensor& w, float* y, ThreadPool* pool) {
  PAGODA_CHECK(w.layout == TensorLayout::kBackendPacked &&
               "the AVX2 matmul takes weights from pack_matmul_weight_avx2");
  if (m <= 0 || w.num_rows() <= 0) return;
  matmul_packed_pooled(x, m, w, y, pool);
}

void matmul_avx2(const float* x, int64_t m, const Tensor& w, float* y) {
  matmul_avx2_pooled(x, m, w, y, &cpu_thread_pool());
}

}  // namespace pagoda::cpu
