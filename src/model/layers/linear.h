// Linear: one projection of a model, y[m, out] = x[m, in] W^T, in the form its quantization
// method stores W, and the methods that build it at load:
//  - dense: a Tensor of any DType (f32 / f16 / bf16 or a GGUF block type), in the backend's
//    packed layout where the backend has one; multiplied by Kernels::matmul;
//  - integer codes with scales (IntWeight, backend/kernels.h): W8A8 (int8 per output channel)
//    and W4A8 (int4 in groups), against int8 activations; multiplied by Kernels::matmul_int.
// A Linear owns the memory of what it converted or packed; weights it took as they were stay
// owned by the ModelSource (a mapping). Move-only; apply() is const and thread-compatible.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/kernels.h"
#include "base/status.h"
#include "tensor/tensor.h"

namespace pagoda {

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

  // A W8A8 projection as a checkpoint stores it: int8 codes ([out, in] i8, borrowed: they must
  // outlive the Linear unless the kernels pack them), one scale per output channel (scales.size()
  // == out), and the activations' static scale (0: per token).
  static Linear int8_codes(const Kernels& kernels, const Tensor& codes, std::vector<float> scales, float input_scale);

  // y[m, out] = x[m, in] W^T.
  void apply(const Kernels& kernels, const float* x, int64_t m, float* y) const;

  int64_t out_features() const { return is_int_ ? int_.n : dense_.num_rows(); }
  int64_t in_features() const { return is_int_ ? int_.k : dense_.row_len(); }
  // Bytes of the weights as multiplied (codes and scales for integer ones).
  int64_t weight_bytes() const;
  // "q4_k", "bf16", "w8a8", "w4a8 g128", ...
  std::string type_name() const;
  bool is_int() const { return is_int_; }
  DType dense_type() const { return dense_.dtype; }
  const Tensor& dense_weight() const { return dense_; }

 private:
  bool is_int_ = false;
  Tensor dense_;
  IntWeight int_;
  std::vector<Buffer> storage_;
};

}  // namespace pagoda
