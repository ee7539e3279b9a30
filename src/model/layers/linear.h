// Linear: one projection of a model, y[m, out] = x[m, in] W^T, in the form its quantization
// method stores W, and the methods that build it at load:
//  - dense: a Tensor of any DType (f32 / f16 / bf16 or a GGUF block type), in the backend's
//    packed layout where the backend has one; multiplied by Kernels::matmul;
//  - integer codes with scales (IntWeight, backend/kernels.h): W8A8 (int8 per output channel)
//    and W4A8 (int4 in groups), against int8 activations; multiplied by Kernels::matmul_int;
//  - a checkpoint's packed codes (AWQ, GPTQ, compressed-tensors pack-quantized: int4 / int8 in
//    groups with zero points, GPTQ's act-order column permutation), decoded by
//    loader/packed_linear.h; multiplied by Kernels::matmul_int, with the activations quantized to
//    int8 per token as vLLM's CPU path (IPEX, lowp_mode INT8) computes these checkpoints.
// A Linear owns the memory of what it converted or packed; weights it took as they were stay
// owned by the ModelSource (a mapping). Move-only; apply() is const and thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/kernels.h"
#include "base/status.h"
#include "loader/packed_linear.h"
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

class Linear {
 public:
  Linear() = default;
  Linear(Linear&&) = default;
  Linear& operator=(Linear&&) = default;

  // A dense projection from w ([out, in]), packed for `kernels` when it packs (storage keeps any
  // conversion w points into; it is released once packing has copied it).
  static Linear dense(const Kernels& kernels, Tensor w, Buffer storage);

  // Quantizes w ([out, in], any DType) symmetrically to integer codes: `bits` 8 or 4, scales per
  // group of `group_size` columns (0 or in: per output channel) = max|w| over the group / 127
  // (int8) or / 7 (int4), codes round-to-nearest(w / scale). group_size must divide in and be a
  // multiple of 8 where it is not in. Activations are quantized per token at run time.
  static Linear quantize_int(const Kernels& kernels, const Tensor& w, int bits, int64_t group_size);

  // A projection a checkpoint stores as integer codes (W8A8 / W4A8, or packed AWQ / GPTQ / ...:
  // loader/packed_linear.h), packed for `kernels`.
  static Linear int_codes(const Kernels& kernels, IntCodes codes);

  // y[m, out] = x[m, in] W^T.
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

  int64_t out_features() const { return is_int_ ? int_.n : dense_.num_rows(); }
  int64_t in_features() const { return is_int_ ? int_.k : dense_.row_len(); }
  // Bytes of the weights as multiplied (codes and scales for integer ones).
  int64_t weight_bytes() const;
  // "q4_k", "bf16", "w8a8", "w4a8 g128", ...
  std::string type_name() const;
  bool is_int() const { return is_int_; }
  // The weight's tensor name ("blk.0.attn_q.weight"), as the model set it: what observers see.
  void set_name(std::string name) { name_ = std::move(name); }
  const std::string& name() const { return name_; }
  DType dense_type() const { return dense_.dtype; }
  const Tensor& dense_weight() const { return dense_; }

 private:
  // Whether a and b can go to one matmul_many / matmul_grouped call: dense, of one dtype, layout
  // and row length.
  static bool shares_dense_call(const Linear& a, const Linear& b);

  bool is_int_ = false;
  Tensor dense_;
  IntWeight int_;
  std::vector<int32_t> perm_;  // int_codes: empty, or the input column of each code column (host)
  mutable Buffer gathered_;    // act-order: the gathered activations (device memory; engine thread)
  std::string label_;          // int_codes: the checkpoint's method, for type_name
  std::string name_;
  std::vector<Buffer> storage_;
};

}  // namespace pagoda
