// GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
// Transformers", 2022): rounds a weight matrix W [rows, cols] to a quantized type so that the
// layer's outputs on calibration inputs X move least, min ||X W^T - X Q^T||^2, one column at a
// time: each column is rounded, and its rounding error is spread over the columns not rounded yet
// through the inverse of the inputs' Hessian H = sum over tokens of x x^T. With H diagonal (no
// correlation between input channels) nothing is spread and GPTQ is round-to-nearest.
//
// Here the rounding of a column follows the stored type's own grid: a group (a GGUF block, or an
// int4 / int8 group) gets its scales, as the type's quantizer chooses them, from the values the
// group holds when GPTQ reaches its first column (errors spread from earlier groups included);
// then each element of the group is rounded to the nearest value that grid can store, and the
// result is encoded with those scales. So the output is an ordinary block of the type, read by
// every decoder as any other. Columns go in their stored order (no act-order: GGUF blocks are
// runs of adjacent columns).
//
// Cost: an inverse factor of H (2/3 cols^3 flops, double) and rows x cols^2 multiply-adds for
// the sweep, over the pool's threads; H takes cols^2 floats.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"
#include "tensor/dtype.h"

namespace pagoda {

// H = sum over the tokens seen of x x^T for one input width (the upper triangle, in float).
class GptqHessian {
 public:
  explicit GptqHessian(int64_t cols);
  // Adds the m rows of x [m, cols].
  void add(const float* x, int64_t m);
  int64_t cols() const { return cols_; }
  int64_t tokens() const { return tokens_; }
  // Element (i, j) (either triangle).
  double at(int64_t i, int64_t j) const;

 private:
  int64_t cols_;
  int64_t tokens_ = 0;
  std::vector<float> upper_;  // row-major [cols, cols], the upper triangle filled
};

// The factor GPTQ sweeps with: the upper-triangular U with U^T U = (H + damp * mean(diag H) * I)^-1,
// row-major [cols, cols] (zeros below the diagonal). Fails when H is not positive definite after
// damping (a NaN in the inputs). An all-zero H gives the identity (round-to-nearest). The
// triangular inverse runs on the pool's threads (nullptr: the caller's).
Result<std::vector<double>> gptq_inverse_factor(const GptqHessian& h, double damp, ThreadPool* pool = nullptr);

// Rounds the values of one group of one row: begin() sees the group's current values (and may
// choose scales from them), round(i, v) returns the stored value nearest v for element i of the
// group and remembers its code, end() encodes the group. One per thread (rounders are stateful).
class GptqGroupRounder {
 public:
  virtual ~GptqGroupRounder() = default;
  virtual void begin(int64_t row, int64_t group, const float* values) = 0;
  virtual float round(int64_t i, float v) = 0;
  virtual void end() = 0;
};

// The sweep: w [rows, cols] is rounded in place, group_len columns at a time (group_len divides
// cols), with the rounders make_rounder() returns (one per thread of the pool). Rows are
// independent and split among the threads.
void gptq_sweep(float* w, int64_t rows, int64_t cols, int64_t group_len, const std::vector<double>& u,
                const std::function<std::unique_ptr<GptqGroupRounder>()>& make_rounder, ThreadPool* pool);

// W [rows, cols] (f32) as GGUF block type `type` (a quantized type whose blocks divide cols),
// rounded by GPTQ against u: rows * row-bytes bytes.
std::vector<uint8_t> gptq_quantize_blocks(DType type, const float* w, int64_t rows, int64_t cols,
                                          const std::vector<double>& u, ThreadPool* pool);

// W [rows, cols] as symmetric integer codes (bits 8 or 4, scale per group of `group` columns
// chosen as quantize_weight_row_symmetric chooses it), rounded by GPTQ against u: codes[rows *
// cols], scales[rows * cols / group].
void gptq_quantize_int(const float* w, int64_t rows, int64_t cols, int bits, int64_t group, const std::vector<double>& u,
                       int8_t* codes, float* scales, ThreadPool* pool);

}  // namespace pagoda
