// QuantMix: which type each weight matrix gets when a model is quantized at load, by the rules
// llama-quantize applies when it writes a GGUF file of a given file type (shared/docs/
// quantization-formats.md 1.6), so `--quantization q4_k_m` on f16 weights gives the tensor types a
// Q4_K_M file of the same model has.
//
// A mix names a base type and how some tensors deviate from it:
//  - uniform (--dtype T): every matrix T;
//  - llama-quantize's file types: q8_0, q4_0, q4_1, q5_0, q5_1, q6_k (the base type everywhere,
//    output.weight Q6_K unless the base is Q8_0) and q2_k, q3_k_m, q4_k_m, q5_k_m (attn_v,
//    ffn_down and attn_output by the table of the doc above, from the layer index).
// Then the shape fallback (tensor/dtype.h's dtype_for_rows): a K-quant on rows that are not whole
// 256-element super-blocks becomes Q4_0 (Q2_K, Q3_K), Q5_0 (Q4_K), Q5_1 (Q5_K) or Q8_0 (Q6_K); a
// block type on rows that are not whole 32-element blocks becomes F16. Plain values; thread-safe.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "tensor/dtype.h"

namespace pagoda {

enum class QuantMixRule : uint8_t { kUniform, kFileType, kQ2_K, kQ3_K_M, kQ4_K_M, kQ5_K_M, kIntCodes };

struct QuantMix {
  std::string name;  // "q4_k_m", "w8a8", or the DType's name for a uniform mix
  DType base = DType::kF32;
  QuantMixRule rule = QuantMixRule::kUniform;
  // kIntCodes: the layers' projections become integer codes with int8 activations (Linear::
  // quantize_int): W8A8 (8 bits, one scale per output channel) or W4A8 (4 bits, groups of
  // int_group_size columns); embeddings and the LM head stay as stored, as W8A8 checkpoints
  // leave them.
  int int_bits = 0;
  int64_t int_group_size = 0;
  // llama.cpp's llama_ftype of a file of this mix (GGUF general.file_type: 15 = Q4_K_M); 0 for
  // the mixes that are not a llama-quantize file type.
  uint32_t llama_ftype = 0;
};

// Every DType as a uniform mix.
QuantMix uniform_mix(DType t);
// llama-quantize's file type names, lower case ("q4_k_m"); nullopt for any other.
std::optional<QuantMix> llama_file_type_mix(std::string_view name);
// The names llama_file_type_mix accepts, in its order.
std::vector<std::string> llama_file_type_names();
// "w8a8" (int8 codes per output channel) or "w4a8" (int4 codes in groups of 128 columns); nullopt
// for any other name.
std::optional<QuantMix> int_codes_mix(std::string_view name);

// Where a matrix sits in the model: its canonical (GGUF) name, e.g. "blk.3.ffn_down.weight", and
// the model's layer count and query heads per KV head.
struct WeightSlot {
  std::string_view name;
  int64_t num_layers = 1;
  int64_t gqa_group = 1;
};

// The type the matrix `slot` with rows of `row_len` elements gets under `mix` (not a kIntCodes
// one): f32 for a router, else the mix's rule, then the shape fallback.
DType quant_mix_type(const QuantMix& mix, const WeightSlot& slot, int64_t row_len);

// Under a kIntCodes mix: whether the matrix `slot` becomes integer codes (the blk.N.
// projections), and the group size its rows of row_len get: the mix's where it divides row_len,
// else row_len (one scale per output channel), the two shapes a compressed-tensors config with
// one group_size describes (pagoda quantize writes the same).
bool quant_mix_int_codes(const QuantMix& mix, const WeightSlot& slot);
int64_t quant_mix_int_group(const QuantMix& mix, int64_t row_len);

}  // namespace pagoda
