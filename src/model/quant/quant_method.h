// QuantMethod: how a projection's weights are stored and multiplied (vLLM's LinearMethodBase, with
// its QuantizationConfig's choice of one). The methods form a registry, asked in order for each
// projection a layer loads; the first whose detection applies creates the weights:
//  - a checkpoint's packed codes: AWQ, GPTQ, compressed-tensors pack-quantized (config.json's
//    quantization_config names the method; model/quant/packed_linear.h decodes them);
//  - a checkpoint's int8 codes: compressed-tensors int-quantized, W8A8 / W4A8 (i8 tensors);
//  - codes made at load: --quantization w8a8 / w4a8 on float weights (a kIntCodes mix);
//  - dense: the tensor as stored (f32 / f16 / bf16, or a GGUF file's block types), converted where
//    --dtype or a llama-quantize mix (--quantization q4_k_m) types it (model/quant/quant_mix.h).
// Each method creates the weights (in the backend's memory: packed where the backend packs),
// applies them (Kernels::matmul, or Kernels::matmul_int on int8 activations as vLLM's CPU path
// computes these checkpoints) and reports their bytes and name. Methods are stateless: thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "base/status.h"
#include "model/layers/linear.h"
#include "model/layers/weight_loader.h"
#include "model/quant/packed_linear.h"
#include "model/quant/quant_mix.h"

namespace pagoda {

// A projection a layer asks for.
struct LinearRequest {
  std::string name;            // canonical tensor name: "blk.0.attn_q.weight"
  int64_t rows = 0, cols = 0;  // the whole tensor's [out, in]
  std::string slot;            // the name a mix's rules see (a tied LM head is output.weight)
  Slice slice;                 // this tensor-parallel rank's part
};

class QuantMethod {
 public:
  virtual ~QuantMethod() = default;
  // "awq / gptq / compressed-tensors (checkpoint codes)", ..., "dense": for logs and errors.
  virtual std::string_view name() const = 0;
  // Whether this method makes the projection `r` of what `w` loads: from the checkpoint's declared
  // quantization (config.json), the stored tensor's type (a GGUF block type, i8 codes) and the
  // load-time mix (--dtype, --quantization).
  virtual bool applies(const WeightLoader& w, const LinearRequest& r) const = 0;
  // Reads the projection's weights and makes them the device's; an error names the tensor and
  // the problem.
  virtual Result<Linear> create_weights(WeightLoader& w, const LinearRequest& r) const = 0;
  // y[m, out] = x[m, in] W^T.
  virtual void apply(const Kernels& kernels, const Linear& l, const float* x, int64_t m, float* y) const = 0;
  // Whether it multiplies integer codes on int8 activations (Kernels::matmul_int).
  virtual bool integer() const = 0;
  // Bytes of the weights as multiplied, and their type as the logs name it ("q4_k", "w8a8").
  virtual int64_t weight_bytes(const Linear& l) const;
  virtual std::string type_name(const Linear& l) const;
};

// The registry, in the order the methods are asked.
std::span<const QuantMethod* const> quant_methods();
// The first method that applies to `r` (dense applies to every projection).
const QuantMethod& quant_method_for(const WeightLoader& w, const LinearRequest& r);

// A dense projection from w ([out, in], host memory), packed for `kernels` where they pack, else
// uploaded (`storage`: memory w points into, kept while the projection reads it).
Linear make_dense_linear(const Kernels& kernels, Tensor w, Buffer storage);

// w ([out, in], any DType, host memory) quantized symmetrically to integer codes: `bits` 8 or 4,
// scales per group of `group_size` columns (0 or in: per output channel) = max|w| over the group
// / 127 (int8) or / 7 (int4), codes round-to-nearest(w / scale). group_size must divide in and be
// a multiple of 8 where it is not in. Activations are quantized per token at run time.
Linear quantize_int_linear(const Kernels& kernels, const Tensor& w, int bits, int64_t group_size);

// What --quantization NAME asks for (vLLM's names and ours): nothing ("" or "none"), a method the
// checkpoint must declare ("awq", "gptq", "compressed-tensors"; the Marlin names are the same
// checkpoints), "gguf" (a GGUF file's own types), or a mix applied to float weights at load (w8a8,
// w4a8, llama-quantize's file types); nullopt for any other name (quantization_flag_names lists
// the known ones).
struct QuantizationFlag {
  enum class Kind { kNone, kCheckpoint, kGguf, kLoadMix };
  Kind kind = Kind::kNone;
  std::string checkpoint_method;  // kCheckpoint: as config.json's quant_method spells it
  std::optional<QuantMix> mix;    // kLoadMix
};
std::optional<QuantizationFlag> parse_quantization_flag(std::string_view name);
std::string quantization_flag_names();

}  // namespace pagoda
