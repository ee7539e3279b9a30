// Offline quantization, `pagoda quantize`: a model's weights written quantized, as llama-quantize
// (a GGUF file in one of its file types) or llm-compressor (a compressed-tensors W8A8 / W4A8
// folder) would write them, optionally rounded by GPTQ (gptq.h) or given static activation scales
// from calibration texts (calibration.h). The types chosen follow the same mixes as quantizing at
// load (model/quant/quant_mix.h), so a served output computes what the input served with
// --quantization TYPE computes.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

#include "base/status.h"

namespace pagoda {

struct QuantizeOptions {
  std::string input, output;
  std::string type;  // a llama-quantize file type (q4_k_m, q8_0, ...: GGUF out), or w8a8 / w4a8
  // w8a8 / w4a8 (a compressed-tensors folder out): static activation scales from these texts,
  // SmoothQuant's migration strength (< 0: none), how many texts and tokens of each to run.
  // With gptq (any type), the texts' activations feed GPTQ's rounding of the weights instead
  // and w8a8 / w4a8 activations stay per token.
  std::string calibration_file;
  bool gptq = false;
  bool act_order = true;  // with gptq: gptq_act_order's column order (gptq.h)
  double smooth_alpha = -1;
  int64_t num_calibration_samples = 128;
  int64_t max_seq_len = 512;
  std::string tokenizer;  // for the calibration texts: default the input's own
};

// Progress and the summary of what was written, a line at a time.
using QuantizeLog = std::function<void(std::string_view line)>;

// Writes options.output from options.input as options.type says; an error names the input, the
// tensor or the option at fault, and nothing is written before the inputs are checked.
Status quantize(const QuantizeOptions& options, const QuantizeLog& log);

// The two writers quantize() picks between: a GGUF file (quantize_gguf.cpp) and a
// compressed-tensors folder (quantize_compressed.cpp).
Status quantize_gguf(const QuantizeOptions& options, const QuantizeLog& log);
Status quantize_compressed(const QuantizeOptions& options, const QuantizeLog& log);

}  // namespace pagoda
