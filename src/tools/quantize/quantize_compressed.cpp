// A float model to W8A8 / W4A8 (`pagoda quantize IN OUT --type w8a8|w4a8`): a float model (GGUF file or Hugging Face folder) to
// a compressed-tensors "int-quantized" folder, as llm-compressor writes W8A8 / W4A8 checkpoints
// (shared/docs/quantization-formats.md 4.1-4.3), which Pagoda and vLLM load:
//  - every layer projection as int8 codes ("weight", I8; int4 values one per byte for w4a8) with
//    f32 "weight_scale" per output channel ([out, 1]) or, for w4a8, per group of 128 ([out,
//    in / 128]; per channel where 128 does not divide the row), the
//    codes and scales of tensor/convert.h's quantize_weight_row_symmetric, so OUT computes what
//    IN computes with --quantization w8a8 / w4a8 at load (without calibration: to the last bit);
//  - --calibration-file texts.jsonl: the float model runs over the texts and each projection gets
//    a static activation scale, "input_scale" = max |x| / 127 over every token seen (vLLM's static
//    per-tensor scheme); --smooth-alpha A first migrates activation outliers into the weights as
//    SmoothQuant does: s_j = max|x_j|^A / max|w_j|^(1 - A) per input channel, the weights'
//    columns times s_j, the operation before divided by it (the RMSNorm weights before q/k/v and
//    gate/up, the rows of up before down);
//  - --gptq --calibration-file texts.jsonl: the codes are rounded by GPTQ against each
//    projection's inputs on the texts (gptq.h; the scales chosen as without it), and the
//    activations stay per token;
//  - everything else (embeddings, norms, the LM head, biases) as stored, in "ignore".
// A Hugging Face input's config.json (with quantization_config added) and tokenizer files are
// copied; a GGUF input gets a config.json written from its metadata (Q/K rows back in the
// Hugging Face order) and no tokenizer files: pass --tokenizer IN.gguf when serving it.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "loader/safetensors_writer.h"
#include "model/layers/linear.h"
#include "model/quant/quant_mix.h"
#include "tensor/convert.h"
#include "tools/quantize/calibration.h"
#include "tools/quantize/quantize.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kProjections[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};

std::string layer_name(int64_t layer, const char* what) {
  return "blk." + std::to_string(layer) + "." + what + ".weight";
}

// A weight as f32 values, [rows, cols] (a vector: rows 1).
struct Host {
  int64_t rows = 0, cols = 0;
  std::vector<float> v;
  float* row(int64_t r) { return v.data() + r * cols; }
};

Host to_host(const Tensor& t) {
  Host h{t.ndim == 1 ? 1 : t.num_rows(), t.row_len(), {}};
  h.v.resize(static_cast<size_t>(h.rows * h.cols));
  for (int64_t r = 0; r < h.rows; ++r) dequantize_row(t.dtype, t.row(r), h.row(r), h.cols);
  return h;
}

// GGUF llama files store Q/K rows permuted for adjacent-pair RoPE: GGUF row (head, 2i + p) is
// Hugging Face row (head, p * hd / 2 + i). Back to the Hugging Face order.
void unpermute_rope_rows(Host* w, int64_t head_dim) {
  const std::vector<float> src = w->v;
  const int64_t half = head_dim / 2;
  for (int64_t r = 0; r < w->rows; ++r) {
    const int64_t head = r / head_dim, in_head = r % head_dim, p = in_head / half, i = in_head % half;
    const int64_t from = head * head_dim + 2 * i + p;
    std::copy_n(src.data() + from * w->cols, w->cols, w->row(r));
  }
}

// SmoothQuant's migration for one group of projections sharing an input: members' columns times
// s, `before` (a norm vector, or the rows of the projection making the input) divided by it, the
// members' channel maxima divided by it.
void smooth(double alpha, std::vector<Host*> members, std::vector<std::vector<float>*> stats, Host* before,
            bool before_is_rows) {
  const int64_t k = members[0]->cols;
  for (int64_t j = 0; j < k; ++j) {
    float xmax = 0, wmax = 0;
    for (auto* s : stats) xmax = std::max(xmax, (*s)[static_cast<size_t>(j)]);
    for (Host* w : members) {
      for (int64_t r = 0; r < w->rows; ++r) wmax = std::max(wmax, std::fabs(w->v[static_cast<size_t>(r * k + j)]));
    }
    if (!(xmax > 0) || !(wmax > 0)) continue;
    const double s = std::clamp(std::pow(static_cast<double>(xmax), alpha) / std::pow(static_cast<double>(wmax), 1 - alpha),
                                1e-5, 1e5);
    const auto sf = static_cast<float>(s);
    for (Host* w : members) {
      for (int64_t r = 0; r < w->rows; ++r) w->v[static_cast<size_t>(r * k + j)] *= sf;
    }
    for (auto* st : stats) (*st)[static_cast<size_t>(j)] /= sf;
    if (before_is_rows) {
      for (float& v : std::span<float>(before->row(j), static_cast<size_t>(before->cols))) v /= sf;
    } else {
      before->v[static_cast<size_t>(j)] /= sf;
    }
  }
}

json hf_config_from(const ModelConfig& c) {
  const bool qwen = c.architecture == "qwen2" || c.architecture == "qwen3";
  const std::string arch = c.architecture == "qwen2" ? "Qwen2ForCausalLM" : c.architecture == "qwen3" ? "Qwen3ForCausalLM" : "LlamaForCausalLM";
  json j = {{"architectures", {arch}},
            {"model_type", qwen ? c.architecture : std::string("llama")},
            {"vocab_size", c.vocab_size},
            {"hidden_size", c.hidden_size},
            {"intermediate_size", c.intermediate_size},
            {"num_hidden_layers", c.num_layers},
            {"num_attention_heads", c.num_heads},
            {"num_key_value_heads", c.num_kv_heads},
            {"head_dim", c.head_dim},
            {"max_position_embeddings", c.max_position_embeddings},
            {"rms_norm_eps", c.rms_norm_eps},
            {"rope_theta", c.rope_theta},
            {"tie_word_embeddings", c.tie_word_embeddings},
            {"hidden_act", "silu"},
            {"torch_dtype", "float32"}};
  if (c.architecture == "llama") j["attention_bias"] = c.attention_bias;
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  const RopeScaling& r = c.rope_scaling;
  if (r.type == RopeScaling::Type::kLinear) j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", r.factor}};
  if (r.type == RopeScaling::Type::kLlama3) {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", r.factor},
                         {"low_freq_factor", r.low_freq_factor},
                         {"high_freq_factor", r.high_freq_factor},
                         {"original_max_position_embeddings", r.original_max_position_embeddings}};
  }
  return j;
}

std::vector<uint8_t> bytes_of(const float* v, size_t n) {
  std::vector<uint8_t> b(n * sizeof(float));
  std::memcpy(b.data(), v, b.size());
  return b;
}

// The options a compressed-tensors type takes.
Status check_options(const QuantizeOptions& f) {
  if (f.smooth_alpha != -1 && !(f.smooth_alpha >= 0 && f.smooth_alpha <= 1)) {  // -1: not given
    return invalid_argument("--smooth-alpha must be in [0, 1]");
  }
  if (f.smooth_alpha >= 0 && f.calibration_file.empty()) {
    return invalid_argument("--smooth-alpha needs --calibration-file (the activations' channel ranges)");
  }
  if (f.gptq && f.smooth_alpha >= 0) {
    return invalid_argument("--gptq with --smooth-alpha is not supported (GPTQ keeps activations per token)");
  }
  return Status();
}

// An input it can read: float weights of a dense model not quantized already.
Status check_input(const QuantizeOptions& f, const ModelSource& src) {
  const ModelConfig& cfg = src.config;
  if (!cfg.quantization.method.empty()) {
    return invalid_argument(f.input + " is already quantized (" + cfg.quantization.method + ")");
  }
  if (cfg.num_experts > 0) {
    return invalid_argument(f.input + ": pagoda quantize --type " + f.type + " does not write mixtures of experts (" +
                            cfg.architecture + ") yet");
  }
  for (const auto& [name, t] : src.weights.all()) {
    if (is_quantized(t.dtype) || !dtype_traits(t.dtype).dense_matmul) {
      return invalid_argument(f.input + ": tensor " + name + " is " + std::string(dtype_name(t.dtype)) +
                              "; pagoda quantize --type " + f.type + " reads float (f32, f16, bf16) weights");
    }
  }
  return Status();
}

// What calibration measured: each projection's input channel maxima (static activation scales,
// SmoothQuant), or with --gptq the inputs' Hessians (the activations stay per token).
struct Measured {
  bool fixed = false;  // static per-tensor activation scales
  std::map<std::string, std::vector<float>> stats;
  InputHessians hessians;
};

Status calibrate(const QuantizeOptions& f, const ModelSource& src, const QuantizeLog& log, Measured* m) {
  m->fixed = !f.calibration_file.empty() && !f.gptq;
  if (f.calibration_file.empty()) return Status();
  PAGODA_ASSIGN_OR_RETURN(const Calibration calibration, Calibration::open(f));
  ChannelMax channel_max;
  LinearInputObserver* observer = m->fixed ? static_cast<LinearInputObserver*>(&channel_max) : &m->hessians;
  PAGODA_ASSIGN_OR_RETURN(const int64_t tokens, calibration.run(src, observer));
  log("calibration: " + std::to_string(calibration.num_texts()) + " texts, " + std::to_string(tokens) +
      " tokens through the float model");
  m->stats = std::move(channel_max.max());
  return Status();
}

// The weights that change, as f32 in the Hugging Face row order, by canonical name: every
// projection, and with smoothing the norms before them (smoothed).
using HostWeights = std::map<std::string, Host>;
Result<HostWeights> changed_weights(const QuantizeOptions& f, const ModelSource& src, Measured* m) {
  const ModelConfig& cfg = src.config;
  HostWeights host;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    for (const char* p : kProjections) {
      const std::string name = layer_name(i, p);
      host[name] = to_host(*src.weights.find(name));
      if ((m->fixed && !m->stats.count(name)) || (f.gptq && m->hessians.find(name) == nullptr)) {
        return invalid_argument("calibration saw no input of " + name);
      }
    }
    if (cfg.rope_interleaved) {
      unpermute_rope_rows(&host[layer_name(i, "attn_q")], cfg.head_dim);
      unpermute_rope_rows(&host[layer_name(i, "attn_k")], cfg.head_dim);
      // The calibration saw the permuted rows' outputs, not their inputs: the stats stand.
    }
  }
  if (f.smooth_alpha < 0) return host;
  auto& stats = m->stats;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    const std::string attn_norm = layer_name(i, "attn_norm"), ffn_norm = layer_name(i, "ffn_norm");
    host[attn_norm] = to_host(*src.weights.find(attn_norm));
    host[ffn_norm] = to_host(*src.weights.find(ffn_norm));
    auto n = [&](const char* p) { return layer_name(i, p); };
    smooth(f.smooth_alpha, {&host[n("attn_q")], &host[n("attn_k")], &host[n("attn_v")]},
           {&stats[n("attn_q")], &stats[n("attn_k")], &stats[n("attn_v")]}, &host[attn_norm], false);
    smooth(f.smooth_alpha, {&host[n("ffn_gate")], &host[n("ffn_up")]}, {&stats[n("ffn_gate")], &stats[n("ffn_up")]},
           &host[ffn_norm], false);
    smooth(f.smooth_alpha, {&host[n("ffn_down")]}, {&stats[n("ffn_down")]}, &host[n("ffn_up")], true);
  }
  return host;
}

bool is_projection(const std::string& name) {
  for (const char* p : kProjections) {
    if (name.ends_with(std::string(".") + p + ".weight")) return true;
  }
  return false;
}

// Every tensor under its Hugging Face name: the projections as int8 codes with their scales (and
// static input scales), the rest as stored or smoothed. Counts what it wrote in *kinds.
Result<uint64_t> write_tensors(const QuantizeOptions& f, const QuantMix& mix, const ModelSource& src,
                               HostWeights& host, Measured& m, SafetensorsWriter* out,
                               std::map<std::string, int>* kinds) {
  const int bits = mix.int_bits;
  ThreadPool pool;
  GptqFactors factors(&pool, f.act_order);
  uint64_t bytes_out = 0;
  for (const auto& [name, t] : src.weights.all()) {
    const std::optional<std::string> hf = hf_name_from_canonical(name);
    if (!hf) return invalid_argument(f.input + ": tensor " + name + " has no Hugging Face name");
    auto it = host.find(name);
    if (it == host.end()) {
      if (src.config.rope_interleaved && (name.ends_with("attn_q.bias") || name.ends_with("attn_k.bias"))) {
        return invalid_argument(f.input + ": Q/K biases in a GGUF llama file are not supported");
      }
      out->add_tensor(*hf, t);
      bytes_out += static_cast<uint64_t>(t.nbytes());
      ++(*kinds)[std::string(dtype_name(t.dtype))];
      continue;
    }
    Host& w = it->second;
    const std::vector<int64_t> shape = t.ndim == 1 ? std::vector<int64_t>{w.cols} : std::vector<int64_t>{w.rows, w.cols};
    if (!is_projection(name)) {  // a smoothed norm
      out->add_tensor(*hf, DType::kF32, shape, bytes_of(w.v.data(), w.v.size()));
      bytes_out += w.v.size() * 4;
      ++(*kinds)["f32 (smoothed)"];
      continue;
    }
    if (bits == 4 && w.cols % 2 != 0) {
      return invalid_argument(f.input + ": tensor " + name + " has rows of " + std::to_string(w.cols) +
                              " values, not whole int4 pairs");
    }
    const int64_t group = bits == 4 ? quant_mix_int_group(mix, w.cols) : w.cols;
    const int64_t groups = w.cols / group;
    std::vector<uint8_t> codes(static_cast<size_t>(w.rows * w.cols));
    std::vector<float> scales(static_cast<size_t>(w.rows * groups));
    auto* code_rows = reinterpret_cast<int8_t*>(codes.data());
    if (f.gptq) {
      PAGODA_ASSIGN_OR_RETURN(const GptqFactors::Factor* factor, factors.get(m.hessians, name, group));
      gptq_quantize_int(w.v.data(), w.rows, w.cols, bits, group, factor->u, code_rows, scales.data(), &pool, factor->order);
    } else {
      for (int64_t r = 0; r < w.rows; ++r) {
        quantize_weight_row_symmetric(w.row(r), w.cols, bits, group, code_rows + r * w.cols, scales.data() + r * groups);
      }
    }
    const std::string base = hf->substr(0, hf->size() - 6);
    out->add_tensor(*hf, DType::kI8, shape, codes);
    out->add_tensor(base + "weight_scale", DType::kF32, {w.rows, groups}, bytes_of(scales.data(), scales.size()));
    bytes_out += codes.size() + scales.size() * 4;
    if (m.fixed) {
      const std::vector<float>& mx = m.stats[name];
      const float amax = mx.empty() ? 0.0f : *std::max_element(mx.begin(), mx.end());
      const float input_scale = amax > 0 ? amax / 127.0f : 1.0f / 127.0f;
      out->add_tensor(base + "input_scale", DType::kF32, {1}, bytes_of(&input_scale, 1));
    }
    ++(*kinds)[std::string(bits == 8 ? "w8a8" : "w4a8") + (group == w.cols ? "" : " g" + std::to_string(group))];
  }
  return bytes_out;
}

// config.json: the input's (with quantization_config) or one written from the GGUF metadata.
Result<json> output_config(const QuantizeOptions& f, const QuantMix& mix, const ModelConfig& cfg, bool fixed) {
  json config;
  if (fs::is_directory(f.input)) {
    std::ifstream in(fs::path(f.input) / "config.json");
    config = json::parse(in, nullptr, false);
    if (config.is_discarded() || !config.is_object()) return invalid_argument(f.input + "/config.json: not a JSON object");
  } else {
    config = hf_config_from(cfg);
  }
  const int bits = mix.int_bits;
  json weights = {{"num_bits", bits}, {"type", "int"}, {"symmetric", true}, {"dynamic", false}};
  if (bits == 8) {
    weights["strategy"] = "channel";
  } else {
    weights["strategy"] = "group";
    weights["group_size"] = mix.int_group_size;
  }
  json acts = {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", fixed ? "tensor" : "token"},
               {"dynamic", !fixed}};
  config["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "int-quantized"},
      {"quantization_status", "compressed"},
      {"ignore", {"lm_head"}},
      {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", acts}}}}}};
  return config;
}

// A Hugging Face input's tokenizer files, copied beside the output; how many.
Result<int> copy_tokenizer_files(const QuantizeOptions& f) {
  int copied = 0;
  for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                           "tokenizer.model", "chat_template.jinja", "vocab.json", "merges.txt"}) {
    const fs::path from = fs::path(f.input) / file;
    if (!fs::is_regular_file(from)) continue;
    std::error_code ec;
    fs::copy_file(from, fs::path(f.output) / file, fs::copy_options::overwrite_existing, ec);
    if (ec) return invalid_argument(from.string() + ": cannot copy: " + ec.message());
    ++copied;
  }
  return copied;
}

}  // namespace

Status quantize_compressed(const QuantizeOptions& f, const QuantizeLog& log) {
  const std::optional<QuantMix> mix = int_codes_mix(f.type);
  if (!mix) return invalid_argument("--type " + f.type + " does not write a compressed-tensors folder");
  PAGODA_RETURN_IF_ERROR(check_options(f));
  PAGODA_ASSIGN_OR_RETURN(const ModelSource src, load_model(f.input, LoadOptions{}));
  PAGODA_RETURN_IF_ERROR(check_input(f, src));
  Measured measured;
  PAGODA_RETURN_IF_ERROR(calibrate(f, src, log, &measured));
  PAGODA_ASSIGN_OR_RETURN(HostWeights host, changed_weights(f, src, &measured));
  SafetensorsWriter out;
  std::map<std::string, int> kinds;
  PAGODA_ASSIGN_OR_RETURN(const uint64_t bytes_out, write_tensors(f, *mix, src, host, measured, &out, &kinds));
  PAGODA_ASSIGN_OR_RETURN(const json config, output_config(f, *mix, src.config, measured.fixed));

  std::error_code ec;
  fs::create_directories(f.output, ec);
  if (ec) return invalid_argument(f.output + ": cannot create the folder: " + ec.message());
  {
    std::ofstream c(fs::path(f.output) / "config.json");
    c << config.dump(2) << "\n";
    if (!c) return invalid_argument(f.output + "/config.json: cannot write");
  }
  PAGODA_RETURN_IF_ERROR(out.write((fs::path(f.output) / "model.safetensors").string()));
  const bool hf_input = fs::is_directory(f.input);
  int copied = 0;
  if (hf_input) {
    PAGODA_ASSIGN_OR_RETURN(copied, copy_tokenizer_files(f));
  }

  std::string summary;
  for (const auto& [kind, count] : kinds) summary += (summary.empty() ? "" : ", ") + std::to_string(count) + " " + kind;
  char size[32];
  std::snprintf(size, sizeof size, "%.2f MB", static_cast<double>(bytes_out) / 1e6);
  log(f.input + " -> " + f.output + " (compressed-tensors int-quantized, " +
      (measured.fixed ? "static per-tensor" : "per-token") + " activations" + (f.smooth_alpha >= 0 ? ", smoothed" : "") +
      (f.gptq ? ", GPTQ weights" : "") + "): " + summary + "; tensor data " + size);
  if (!hf_input) {
    log("note: " + f.output + " has no tokenizer files; serve it with --tokenizer " + f.input);
  } else {
    log("copied config.json and " + std::to_string(copied) + " tokenizer files");
  }
  return Status();
}

}  // namespace pagoda
