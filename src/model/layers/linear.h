// Linear: one projection of a model, y[m, out] = x[m, in] W^T: the weights its quantization method
// made (model/quant/quant_method.h: dense in any DType, or integer codes with scales), and the
// method, which multiplies them. A Linear owns the memory of what its method converted, uploaded
// or packed; weights read where they lie stay owned by the ModelSource (a mapping, on the CPU).
// Move-only; apply() is const and thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/kernels.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace pagoda {

// Calibration (pagoda quantize --calibration-file): an observer installed on a thread sees the
// input of every Linear::apply made on that thread, before any column reordering, with the
// Linear's name.
class LinearInputObserver {
 public:
  virtual ~LinearInputObserver() = default;
  virtual void observe(const std::string& name, const float* x, int64_t m, int64_t k) = 0;
};

// Installs `observer` on this thread for its lifetime (the previous one, if any, after it).
class ScopedLinearInputObserver {
 public:
  explicit ScopedLinearInputObserver(LinearInputObserver* observer);
  ~ScopedLinearInputObserver();
  ScopedLinearInputObserver(const ScopedLinearInputObserver&) = delete;
  ScopedLinearInputObserver& operator=(const ScopedLinearInputObserver&) = delete;

 private:
  LinearInputObserver* previous_;
};

class Linear;

// One product of Linear::apply_grouped: rows [row, row + m) of the call's input through `linear`
// into y ([m, out]).
struct LinearGroup {
  int64_t row = 0;
  int64_t m = 0;
  const Linear* linear = nullptr;
  float* y = nullptr;
};

class QuantMethod;

// What a QuantMethod (model/quant/quant_method.h) made of one projection's weights, in the
// device's memory: a dense tensor, or integer codes with their scales.
struct LinearWeights {
  Tensor dense;                  // dense methods: [out, in] of any dense DType, packed or uploaded
  IntWeight codes;               // integer methods: codes, scales, zero points (packed)
  std::vector<int32_t> perm;     // empty, or the input column of each code column (act-order; host)
  std::string label;             // integer methods: what type_name says ("awq int4 g128", "w8a8")
  std::vector<Buffer> storage;   // the memory the weights point into
};

class Linear {
 public:
  Linear() = default;
  Linear(const QuantMethod& method, LinearWeights weights) : method_(&method), w_(std::move(weights)) {}
  Linear(Linear&&) = default;
  Linear& operator=(Linear&&) = default;

  // y[m, out] = x[m, in] W^T, as the projection's method computes it.
  void apply(const Kernels& kernels, const float* x, int64_t m, float* y) const;

  // y[i] = x ls[i]^T for i < count (count <= 4, one input width): what apply writes for each,
  // bit for bit. Dense weights of one dtype go through kernels.matmul_many where the table has
  // it (one parallel step: q/k/v, gate/up); the others one apply at a time.
  static void apply_many(const Kernels& kernels, const float* x, int64_t m, const Linear* const* ls,
                         float* const* ys, int count);

  // For each group, what apply(x + row * in, m) writes, bit for bit: a mixture of experts' active
  // experts over their tokens. Dense weights of one dtype, layout and input width go through
  // kernels.matmul_grouped where the table has it (one parallel step for all of them); the others
  // one apply at a time. Groups of no rows are skipped.
  static void apply_grouped(const Kernels& kernels, const float* x, const LinearGroup* groups, int count);

  const QuantMethod& method() const { return *method_; }
  const LinearWeights& weights() const { return w_; }
  // Whether its method multiplies integer codes (matmul_int) rather than a dense matrix.
  bool is_int() const;
  int64_t out_features() const { return is_int() ? w_.codes.n : w_.dense.num_rows(); }
  int64_t in_features() const { return is_int() ? w_.codes.k : w_.dense.row_len(); }
  // Bytes of the weights as multiplied (codes and scales for integer ones).
  int64_t weight_bytes() const;
  // "q4_k", "bf16", "w8a8", "w4a8 g128", "awq int4 g128 act-order", ...
  std::string type_name() const;
  // The weight's tensor name ("blk.0.attn_q.weight"), as the model set it: what observers see.
  void set_name(std::string name) { name_ = std::move(name); }
  const std::string& name() const { return name_; }
  const Tensor& dense_weight() const { return w_.dense; }
  // Device memory a method may keep scratch rows in between calls (the engine thread's).
  Buffer& scratch() const { return scratch_; }
  // Shows the input to this thread's LinearInputObserver, if one is installed (calibration).
  void observe(const Kernels& kernels, const float* x, int64_t m) const;

 private:
  // Whether a and b can go to one matmul_many / matmul_grouped call: dense, of one dtype, layout
  // and row length.
  static bool shares_dense_call(const Linear& a, const Linear& b);

  const QuantMethod* method_ = nullptr;
  LinearWeights w_;
  mutable Buffer scratch_;
  std::string name_;
};

}  // namespace pagoda
