// GPTQ (Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative Pre-trained
// Transformers", 2022): rounds a weight matrix W [rows, cols] to a quantized type so that the
// layer's outputs on calibration inputs X move least, min ||X W^T - X Q^T||^2, one column at a
// time: each column is rounded, and its rounding error is spread over the columns not rounded yet
// through the inverse of the inputs' Hessian H = sum over tokens of x x^T. With H diagonal (no
// correlation between input channels) nothing is spread and GPTQ is round-to-nearest.
//
// Here the rounding of a column follows the stored type's own grid: a group (a GGUF block, or an
// int4 / int8 group) gets its scales from the values the group holds when GPTQ reaches its first
// column (errors spread from earlier groups included); then each element of the group is rounded
// to the nearest value that grid can store, and the result is encoded with those scales. The
// types with one scale and symmetric codes (Q4_0, Q5_0, Q8_0, the int4 / int8 groups) search that
// scale against the calibration (gptq_group_scale), Q4_1 / Q5_1 their scale and offset
// (gptq_group_affine); the K-quants take their quantizer's scales. So
// the output is an ordinary block of the type, read by every decoder as any other.
//
// The sweep may take the columns in another order than the stored one (GPTQ's act-order,
// `desc_act`: the columns whose inputs are largest first, while the most columns remain to absorb
// their error). Here an order keeps each group's columns together (gptq_act_order), so a group is
// still a run of adjacent stored columns and the output needs no g_idx.
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
// triangular inverse runs on the pool's threads (nullptr: the caller's). With an `order` (a
// permutation of the columns: order[p] is the stored column swept p-th), U is that of H with its
// rows and columns so permuted, H'(p, q) = H(order[p], order[q]), for a sweep in that order.
Result<std::vector<double>> gptq_inverse_factor(const GptqHessian& h, double damp, ThreadPool* pool = nullptr,
                                                const std::vector<int64_t>& order = {});

// Act-order for groups of group_len adjacent columns (group_len divides cols): the groups by
// decreasing sum of H's diagonal over their columns, and within each group its columns by
// decreasing H(j, j); ties keep the stored order. group_len = cols orders the columns freely.
std::vector<int64_t> gptq_act_order(const GptqHessian& h, int64_t group_len);

// Rounds the values of one group of one row: begin() sees the group's current values and what
// rounding each costs the layer's outputs (GPTQ's importance of its column: the loss of an error
// e in column j is (e / U(j, j))^2, so importance 1 / U(j, j)^2), and may choose scales from
// them; round(i, v) returns the stored value nearest v for element i of the
// group and remembers its code, end() encodes the group. One per thread (rounders are stateful).
class GptqGroupRounder {
 public:
  virtual ~GptqGroupRounder() = default;
  virtual void begin(int64_t row, int64_t group, const float* values, const double* importance) = 0;
  virtual float round(int64_t i, float v) = 0;
  virtual void end() = 0;
};

// The sweep: w [rows, cols] is rounded in place, group_len columns at a time (group_len divides
// cols), with the rounders make_rounder() returns (one per thread of the pool). Rows are
// independent and split among the threads. With an `order` (empty: the stored one), the columns
// go in that order, u being the factor gptq_inverse_factor gave for it; the order must keep each
// group's columns together (as gptq_act_order's does). The rounders still see stored groups:
// begin() gets the group's values and importances in stored order, round(i, v) the stored index.
void gptq_sweep(float* w, int64_t rows, int64_t cols, int64_t group_len, const std::vector<double>& u,
                const std::function<std::unique_ptr<GptqGroupRounder>()>& make_rounder, ThreadPool* pool,
                const std::vector<int64_t>& order = {});

// The scale of one group of n values v of a type that stores value = scale * code, code in [lo,
// hi] (lo < 0 < hi): the scale s whose codes q_i = clamp(round(v_i / s), lo, hi) give the least
// sum imp_i (v_i - s q_i)^2. Searched among the scales that map the largest |v_i| to lo or hi,
// less 1.5 to plus 2 codes in steps of a tenth, each with the least-squares scale of its codes,
// and `rtn_scale` (the type's own quantizer's), so never worse than it. f16_scale: the scales
// are as f16 stores them. negative_ok: negative scales (a GGUF d may be one) are searched too.
// 0 for an all-zero group.
float gptq_group_scale(const float* v, const double* imp, int64_t n, int lo, int hi, float rtn_scale, bool f16_scale,
                       bool negative_ok);

// The scale and offset of one group of n values v of a type that stores value = d * code + m,
// code in [0, hi] (Q4_1, Q5_1; d and m stored as f16): the (d, m) whose nearest codes give the
// least sum imp_i (v_i - d q_i - m)^2, searched as gptq_group_scale searches (the range of v
// over hi codes, less 25% to plus 30%, from the smallest v, to the largest or about the middle,
// each with the least-squares (d, m) of its codes) against `rtn` (the quantizer's), so never
// worse than it.
struct AffineScale {
  float d = 0, m = 0;
};
AffineScale gptq_group_affine(const float* v, const double* imp, int64_t n, int hi, AffineScale rtn);

// W [rows, cols] (f32) as GGUF block type `type` (a quantized type whose blocks divide cols),
// rounded by GPTQ against u: rows * row-bytes bytes.
std::vector<uint8_t> gptq_quantize_blocks(DType type, const float* w, int64_t rows, int64_t cols,
                                          const std::vector<double>& u, ThreadPool* pool,
                                          const std::vector<int64_t>& order = {});

// W [rows, cols] as symmetric integer codes (bits 8: codes in [-127, 127]; bits 4: [-8, 7]), a
// scale per group of `group` columns chosen by gptq_group_scale, rounded by GPTQ against u:
// codes[rows * cols], scales[rows * cols / group].
void gptq_quantize_int(const float* w, int64_t rows, int64_t cols, int bits, int64_t group, const std::vector<double>& u,
                       int8_t* codes, float* scales, ThreadPool* pool, const std::vector<int64_t>& order = {});

}  // namespace pagoda
