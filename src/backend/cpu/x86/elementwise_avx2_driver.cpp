// The Kernels entries of the AVX2 element-wise ops: the leaves of elementwise_avx2.cpp split over
// its context's pool when the op is large (a prefill), built with baseline flags (x86_kernels.h).
#include <algorithm>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/x86/x86_kernels.h"
#include "base/thread_pool.h"

namespace pagoda::cpu {
namespace {
// Elements below which one thread does the whole op (waking the workers costs more).
constexpr int64_t kMinParallelElements = int64_t{1} << 16;
// Elements per unit of parallel work: a multiple of 8 (splits fall between vectors).
constexpr int64_t kChunk = 8192;

template <class Fn>
void split_elements(const ExecContext& ctx, int64_t n, Fn&& fn) {
  if (n < kMinParallelElements) return fn(0, n);
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  pool_of(ctx).parallel_for(chunks, [&](int64_t begin, int64_t end) {
    fn(begin * kChunk, std::min(n, end * kChunk));
  });
}
}  // namespace

void rms_norm_avx2(const ExecContext& ctx, const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                   float* y) {
  if (rows < 2 || rows * dim < kMinParallelElements) return rms_norm_rows_avx2(x, weight, rows, dim, eps, y);
  pool_of(ctx).parallel_for(rows, [&](int64_t begin, int64_t end) {
    rms_norm_rows_avx2(x + begin * dim, weight, end - begin, dim, eps, y + begin * dim);
  });
}

void silu_mul_avx2(const ExecContext& ctx, const float* gate, const float* up, int64_t n, float* out) {
  split_elements(ctx, n, [&](int64_t begin, int64_t end) {
    silu_mul_range_avx2(gate + begin, up + begin, end - begin, out + begin);
  });
}

void add_avx2(const ExecContext& ctx, float* y, const float* x, int64_t n) {
  split_elements(ctx, n, [&](int64_t begin, int64_t end) { add_range_avx2(y + begin, x + begin, end - begin); });
}

}  // namespace pagoda::cpu
