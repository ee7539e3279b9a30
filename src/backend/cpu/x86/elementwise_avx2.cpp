// AVX2 + FMA leaves of the element-wise ops (RMSNorm, SiLU x up, add). Built with -mavx2 -mfma;
// read x86_kernels.h before adding an #include. Each row / element is computed alone, in an order
// that does not depend on how many rows come with it.
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/x86/math_avx2.h"
#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {

void rms_norm_rows_avx2(const float* x, const float* weight, int64_t rows, int64_t dim, float eps,
                        float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= dim; i += 16) {
      const __m256 a = _mm256_loadu_ps(xr + i), b = _mm256_loadu_ps(xr + i + 8);
      s0 = _mm256_fmadd_ps(a, a, s0);
      s1 = _mm256_fmadd_ps(b, b, s1);
    }
    float sum = avx2::hsum(_mm256_add_ps(s0, s1));
    for (; i < dim; ++i) sum += xr[i] * xr[i];
    const float inv = 1.0f / __builtin_sqrtf(sum / static_cast<float>(dim) + eps);
    const __m256 vinv = _mm256_set1_ps(inv);
    i = 0;
    for (; i + 8 <= dim; i += 8) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + i), vinv);
      _mm256_storeu_ps(yr + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
    }
    for (; i < dim; ++i) yr[i] = xr[i] * inv * weight[i];
  }
}

namespace {
// silu(g) * u for 8 lanes: g / (1 + e^-g); e^-g saturates for large |g|, giving g or a signed zero.
inline __attribute__((always_inline)) __m256 silu_mul8(__m256 g, __m256 u) {
  const __m256 e = avx2::exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), u);
}
}  // namespace

void silu_mul_range_avx2(const float* gate, const float* up, int64_t n, float* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, silu_mul8(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i == n) return;
  // The tail through the same vector code (not expf), so an element's value never depends on
  // whether it ends the buffer: rows give the same bits alone or in a batch.
  alignas(32) float g[8] = {}, u[8] = {}, o[8];
  for (int64_t t = i; t < n; ++t) {
    g[t - i] = gate[t];
    u[t - i] = up[t];
  }
  _mm256_store_ps(o, silu_mul8(_mm256_load_ps(g), _mm256_load_ps(u)));
  for (int64_t t = i; t < n; ++t) out[t] = o[t - i];
}

void add_range_avx2(float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  for (; i < n; ++i) y[i] += x[i];
}

}  // namespace pagoda::cpu
