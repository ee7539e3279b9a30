// The projections a checkpoint stores as integer codes (AWQ's GEMM packing, GPTQ,
// compressed-tensors pack-quantized and int-quantized; layouts in docs/quantization.md), decoded
// at load into one form: signed codes with a scale and a zero point per group of columns, the
// row-major form of IntWeight (backend/kernels.h), which the integer quant methods
// (model/quant/quant_method.h) pack for the backend. The weight's value is w[j, t] = scale(j, g) * (code(j, t) - zero(j, g)).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "loader/model_config.h"
#include "loader/model_source.h"

namespace pagoda {

struct IntCodes {
  int bits = 0;                    // 4 or 8
  int64_t n = 0, k = 0;            // [out, in]
  int64_t group_size = 0;          // columns per scale; k = per output channel
  std::vector<uint8_t> codes;      // bits 8: [n, k] int8; bits 4: [n, k / 2], two's-complement
                                   // int4 pairs, column 2u in the low nibble of byte u
  std::vector<float> scales;       // [n, k / group_size]
  std::vector<int32_t> zero_points;  // [n, k / group_size]; empty when every one is 0
  // Empty, or [k]: column t of codes is input column perm[t] (GPTQ's act-order: columns sorted
  // by group so that groups are contiguous; the activations are gathered the same way).
  std::vector<int32_t> perm;
  std::string method;              // "awq", "gptq", "compressed-tensors", "w4a8": for logs
  float input_scale = 0;           // the activations' static scale (0: per token)

  int64_t groups() const { return group_size > 0 ? k / group_size : 0; }
};

// The most columns one integer scale may cover (Kernels::matmul_int's exact int32 bracket).
constexpr int64_t kMaxIntGroup = 65536;

// A projection a checkpoint stores as int8 tensors (compressed-tensors int-quantized: W8A8, or
// W4A8 with int4 values one per byte) with its scales beside it ("<name>_scale", per output
// channel, per tensor or per group, and optionally a static "<...>.input_scale"): its codes, the
// int4 ones two per byte. Fails naming `path`, the tensor and the problem.
Result<IntCodes> read_int8_linear(const WeightMap& weights, const std::string& path, const std::string& name,
                                  const Tensor& codes, const CheckpointQuantization& q);

// Decodes the packed projection `weight_name` of shape [n, k]. Every inconsistency (tensor types
// and shapes, a group size that does not divide k, a g_idx entry out of range or groups of
// unequal size, a scale that is not finite) fails naming the source, the tensor and the problem.
Result<IntCodes> read_packed_linear(const WeightMap& weights, const std::string& weight_name, int64_t n, int64_t k,
                                    const CheckpointQuantization& q);

}  // namespace pagoda
