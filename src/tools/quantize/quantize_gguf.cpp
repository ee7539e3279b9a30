// A GGUF file to a GGUF file in a llama-quantize file type (`pagoda quantize IN.gguf OUT.gguf
// --type q4_k_m`), llama-quantize's job. Every metadata entry of
// IN is copied (the tokenizer included), general.file_type is set to the type's llama_ftype, and
// each float weight matrix gets the type the mix gives it (model/quant/quant_mix.h: the same rules
// and fallbacks as --quantization at load, so a served OUT computes exactly what IN served with
// --quantization TYPE computes). Tensors already quantized, and vectors, are copied as they are.
// With --gptq --calibration-file texts.jsonl the float model runs over the texts first and every
// projection (and an untied LM head) is rounded by GPTQ against its inputs (gptq.h): the
// same types and block layouts, other codes and scales.
#include <cstdio>
#include <map>
#include <vector>

#include "loader/config_parsers.h"
#include "loader/gguf_file.h"
#include "loader/gguf_writer.h"
#include "loader/model_source.h"
#include "model/quant/quant_mix.h"
#include "tensor/convert.h"
#include "tools/quantize/calibration.h"
#include "tools/quantize/quantize.h"

namespace pagoda {
namespace {

struct WeightSlotShape {
  int64_t num_layers = 0, gqa = 1;
};

// GPTQ over the whole model: one run of the float model over the calibration texts measures the
// input of every projection and of an LM head of its own (a tied one is the token embedding too,
// and is rounded to nearest with the other tensors), then each weight the mix quantizes is
// rounded against its input. (GPTQ's reference instead quantizes layer after layer, measuring
// each layer's inputs on a model whose earlier layers are already quantized; on stories260K that
// measured about the same, q4_0 mean KLD 0.0549 against 0.0551, for a model run per layer.)
Status quantize_by_gptq(const QuantizeOptions& f, const QuantMix& mix, const WeightSlotShape& shape,
                        const QuantizeLog& log, std::map<std::string, std::vector<uint8_t>>* out) {
  PAGODA_ASSIGN_OR_RETURN(const ModelSource source, load_model(f.input, LoadOptions{}));
  PAGODA_ASSIGN_OR_RETURN(const Calibration calibration, Calibration::open(f));
  InputHessians hessians;
  PAGODA_ASSIGN_OR_RETURN(const int64_t tokens, calibration.run(source, &hessians));
  log("calibration: " + std::to_string(calibration.num_texts()) + " texts, " + std::to_string(tokens) +
      " tokens through the float model");
  ThreadPool pool;
  GptqFactors factors(&pool, f.act_order);
  for (const auto& [name, t] : source.weights.all()) {
    if (t.ndim != 2 || hessians.find(name) == nullptr) continue;
    const DType to = quant_mix_type(mix, WeightSlot{name, shape.num_layers, shape.gqa}, t.row_len());
    if (!is_quantized(to) || is_quantized(t.dtype)) continue;
    const int64_t rows = t.num_rows(), cols = t.row_len();
    std::vector<float> w(static_cast<size_t>(rows * cols));
    for (int64_t r = 0; r < rows; ++r) dequantize_row(t.dtype, t.row(r), w.data() + r * cols, cols);
    PAGODA_ASSIGN_OR_RETURN(const GptqFactors::Factor* factor, factors.get(hessians, name, dtype_traits(to).block_elems));
    (*out)[name] = gptq_quantize_blocks(to, w.data(), rows, cols, factor->u, &pool, factor->order);
  }
  return Status();
}

// Checks the options a GGUF type takes and returns its mix.
Result<QuantMix> gguf_mix(const QuantizeOptions& f) {
  const std::optional<QuantMix> mix = llama_file_type_mix(f.type);
  if (!mix) {
    std::string names;
    for (const std::string& n : llama_file_type_names()) names += (names.empty() ? "" : ", ") + n;
    return invalid_argument("--type " + f.type + " is not supported; supported: w8a8, w4a8 (a compressed-tensors "
                            "folder), " + names + " (GGUF)");
  }
  if (f.smooth_alpha != -1) return invalid_argument("--smooth-alpha applies to --type w8a8 / w4a8");
  if (!f.calibration_file.empty() && !f.gptq) {
    return invalid_argument("--calibration-file with a GGUF type needs --gptq (static activation scales apply to "
                            "--type w8a8 / w4a8)");
  }
  if (!starts_with_gguf_magic(f.input)) {
    return invalid_argument(f.input + ": not a GGUF file (pagoda quantize reads and writes GGUF)");
  }
  return *mix;
}

}  // namespace

Status quantize_gguf(const QuantizeOptions& f, const QuantizeLog& log) {
  PAGODA_ASSIGN_OR_RETURN(const QuantMix mix, gguf_mix(f));
  PAGODA_ASSIGN_OR_RETURN(const std::unique_ptr<GgufFile> opened, GgufFile::open(f.input));
  const GgufFile& in = *opened;
  PAGODA_ASSIGN_OR_RETURN(const ModelConfig config, config_from_gguf(in));
  const bool tied = in.find_tensor("output.weight") == nullptr;
  const WeightSlotShape shape{config.num_layers, config.num_heads / std::max<int64_t>(1, config.num_kv_heads)};
  std::map<std::string, std::vector<uint8_t>> by_gptq;  // with --gptq: weight -> its rows
  if (f.gptq) {
    PAGODA_RETURN_IF_ERROR(quantize_by_gptq(f, mix, shape, log, &by_gptq));
  }

  GgufWriter out;
  int skipped = 0;
  for (const auto& [key, value] : in.metadata()) {
    if (key == "general.alignment" || key == "general.file_type") continue;  // ours: 32, and the new type
    if (!out.add_value(key, value)) ++skipped;
  }
  if (skipped > 0) log(std::to_string(skipped) + " metadata arrays of arrays not copied");
  out.add_u32("general.file_type", mix.llama_ftype);

  std::map<std::string, int> types;
  uint64_t bytes_in = 0, bytes_out = 0;
  std::vector<float> row;
  for (const GgufTensorInfo& info : in.tensors()) {
    const Tensor& t = info.tensor;
    bytes_in += static_cast<uint64_t>(t.nbytes());
    const bool matrix = t.ndim == 2 && info.name.ends_with("weight") && !is_quantized(t.dtype) &&
                        dtype_traits(t.dtype).dense_matmul;
    if (!matrix) {
      out.add_tensor(info.name, t);
      bytes_out += static_cast<uint64_t>(t.nbytes());
      ++types[std::string(dtype_name(t.dtype)) + (t.ndim == 2 ? "" : " (vector)")];
      continue;
    }
    // A tied embedding is the LM head too: llama-quantize types it as the output.
    const std::string slot = tied && info.name == "token_embd.weight" ? "output.weight" : info.name;
    const DType to = quant_mix_type(mix, WeightSlot{slot, shape.num_layers, shape.gqa}, t.row_len());
    auto gptq = by_gptq.find(info.name);
    if (gptq != by_gptq.end()) {
      out.add_tensor(info.name, to, {t.num_rows(), t.row_len()}, gptq->second);
      bytes_out += gptq->second.size();
      ++types[std::string(dtype_name(to)) + " (GPTQ)"];
      continue;
    }
    ++types[std::string(dtype_name(to))];
    if (to == t.dtype) {
      out.add_tensor(info.name, t);
      bytes_out += static_cast<uint64_t>(t.nbytes());
      continue;
    }
    const int64_t rows = t.num_rows(), cols = t.row_len();
    const int64_t row_bytes = static_cast<int64_t>(*dtype_bytes(to, static_cast<uint64_t>(cols)));
    std::vector<uint8_t> bytes(static_cast<size_t>(rows * row_bytes));
    row.resize(static_cast<size_t>(cols));
    for (int64_t r = 0; r < rows; ++r) {
      dequantize_row(t.dtype, t.row(r), row.data(), cols);
      quantize_row(to, row.data(), bytes.data() + r * row_bytes, cols);
    }
    out.add_tensor(info.name, to, {rows, cols}, bytes);
    bytes_out += bytes.size();
  }
  PAGODA_RETURN_IF_ERROR(out.write(f.output));
  std::string summary;
  for (const auto& [name, count] : types) summary += (summary.empty() ? "" : ", ") + std::to_string(count) + " " + name;
  char sizes[64];
  std::snprintf(sizes, sizeof sizes, "%.2f MB -> %.2f MB", static_cast<double>(bytes_in) / 1e6,
                static_cast<double>(bytes_out) / 1e6);
  log(f.input + " -> " + f.output + " (" + mix.name + ", general.file_type " + std::to_string(mix.llama_ftype) +
      "): " + summary + "; tensor data " + sizes);
  return Status();
}

}  // namespace pagoda
