// `pagoda quantize IN.gguf OUT.gguf --type q4_k_m`: llama-quantize's job (w8a8 / w4a8 write a
// compressed-tensors folder instead: quantize_compressed.cpp). Every metadata entry of
// IN is copied (the tokenizer included), general.file_type is set to the type's llama_ftype, and
// each float weight matrix gets the type the mix gives it (loader/quant_mix.h: the same rules
// and fallbacks as --quantization at load, so a served OUT computes exactly what IN served with
// --quantization TYPE computes). Tensors already quantized, and vectors, are copied as they are.
#include <cstdio>
#include <map>
#include <vector>

#include "apps/pagoda/commands.h"
#include "loader/config_parsers.h"
#include "loader/gguf_file.h"
#include "loader/gguf_writer.h"
#include "loader/quant_mix.h"
#include "tensor/convert.h"

namespace pagoda::app {

int run_quantize(const QuantizeFlags& f) {
  if (int_codes_mix(f.type)) return run_quantize_compressed(f);
  const std::optional<QuantMix> mix = llama_file_type_mix(f.type);
  if (!mix) {
    std::string names;
    for (const std::string& n : llama_file_type_names()) names += (names.empty() ? "" : ", ") + n;
    return fail(invalid_argument("--type " + f.type + " is not supported; supported: w8a8, w4a8 (a compressed-tensors "
                                 "folder), " + names + " (GGUF)"));
  }
  if (!f.calibration_file.empty() || f.smooth_alpha != -1) {
    return fail(invalid_argument("--calibration-file and --smooth-alpha apply to --type w8a8 / w4a8"));
  }
  if (!starts_with_gguf_magic(f.input)) {
    return fail(invalid_argument(f.input + ": not a GGUF file (pagoda quantize reads and writes GGUF)"));
  }
  auto opened = GgufFile::open(f.input);
  if (!opened.ok()) return fail(opened.status());
  const GgufFile& in = **opened;
  auto config = config_from_gguf(in);
  if (!config.ok()) return fail(config.status());
  const bool tied = in.find_tensor("output.weight") == nullptr;

  GgufWriter out;
  int skipped = 0;
  for (const auto& [key, value] : in.metadata()) {
    if (key == "general.alignment" || key == "general.file_type") continue;  // ours: 32, and the new type
    if (!out.add_value(key, value)) ++skipped;
  }
  if (skipped > 0) std::fprintf(stderr, "pagoda quantize: %d metadata arrays of arrays not copied\n", skipped);
  out.add_u32("general.file_type", mix->llama_ftype);

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
    const DType to = quant_mix_type(*mix, WeightSlot{slot, config->num_layers,
                                                     config->num_heads / std::max<int64_t>(1, config->num_kv_heads)},
                                    t.row_len());
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
  if (Status st = out.write(f.output); !st.ok()) return fail(st);
  std::string summary;
  for (const auto& [name, count] : types) summary += (summary.empty() ? "" : ", ") + std::to_string(count) + " " + name;
  std::printf("%s -> %s (%s, general.file_type %u): %s; tensor data %.2f MB -> %.2f MB\n", f.input.c_str(),
              f.output.c_str(), mix->name.c_str(), mix->llama_ftype, summary.c_str(), static_cast<double>(bytes_in) / 1e6,
              static_cast<double>(bytes_out) / 1e6);
  return 0;
}

}  // namespace pagoda::app
