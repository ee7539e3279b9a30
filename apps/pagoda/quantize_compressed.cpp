// `pagoda quantize IN OUT --type w8a8|w4a8`: a float model (GGUF file or Hugging Face folder) to
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
//    projection's inputs on the texts (tensor/gptq.h; the scales chosen as without it), and the
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

#include "apps/pagoda/calibration.h"
#include "apps/pagoda/commands.h"
#include "launch/model_loading.h"
#include "model/quant/quant_mix.h"
#include "loader/safetensors_writer.h"
#include "model/kv_cache.h"
#include "model/layers/linear.h"
#include "tensor/convert.h"

namespace pagoda::app {
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

}  // namespace

int run_quantize_compressed(const QuantizeFlags& f) {
  const std::optional<QuantMix> mix = int_codes_mix(f.type);
  if (!mix) return fail(invalid_argument("--type " + f.type + " does not write a compressed-tensors folder"));
  if (f.smooth_alpha != -1 && !(f.smooth_alpha >= 0 && f.smooth_alpha <= 1)) {  // -1: not given
    return fail(invalid_argument("--smooth-alpha must be in [0, 1]"));
  }
  if (f.smooth_alpha >= 0 && f.calibration_file.empty()) {
    return fail(invalid_argument("--smooth-alpha needs --calibration-file (the activations' channel ranges)"));
  }
  if (f.gptq && f.smooth_alpha >= 0) {
    return fail(invalid_argument("--gptq with --smooth-alpha is not supported (GPTQ keeps activations per token)"));
  }
  auto loaded = load_model(f.input, LoadOptions{});
  if (!loaded.ok()) return fail(loaded.status());
  const ModelSource& src = *loaded;
  const ModelConfig& cfg = src.config;
  if (!cfg.quantization.method.empty()) {
    return fail(invalid_argument(f.input + " is already quantized (" + cfg.quantization.method + ")"));
  }
  if (cfg.num_experts > 0) {
    return fail(invalid_argument(f.input + ": pagoda quantize --type " + f.type + " does not write mixtures of experts (" +
                                 cfg.architecture + ") yet"));
  }
  for (const auto& [name, t] : src.weights.all()) {
    if (is_quantized(t.dtype) || !dtype_traits(t.dtype).dense_matmul) {
      return fail(invalid_argument(f.input + ": tensor " + name + " is " + std::string(dtype_name(t.dtype)) +
                                   "; pagoda quantize --type " + f.type + " reads float (f32, f16, bf16) weights"));
    }
  }
  const int bits = mix->int_bits;

  // Calibration gives static activation scales (and SmoothQuant's ranges), or with --gptq the
  // inputs' Hessians, the activations staying per token.
  const bool fixed = !f.calibration_file.empty() && !f.gptq;
  std::map<std::string, std::vector<float>> stats;
  InputHessians hessians;
  if (!f.calibration_file.empty()) {
    auto calibration = Calibration::open(f);
    if (!calibration.ok()) return fail(calibration.status());
    ChannelMax channel_max;
    LinearInputObserver* observer = fixed ? static_cast<LinearInputObserver*>(&channel_max) : &hessians;
    auto tokens = calibration->run(src, observer);
    if (!tokens.ok()) return fail(tokens.status());
    std::printf("calibration: %lld texts, %lld tokens through the float model\n",
                static_cast<long long>(calibration->num_texts()), static_cast<long long>(*tokens));
    stats = std::move(channel_max.max());
  }

  // The weights that change: every projection, and with smoothing the norms before them.
  std::map<std::string, Host> host;
  for (int64_t i = 0; i < cfg.num_layers; ++i) {
    for (const char* p : kProjections) {
      const std::string name = layer_name(i, p);
      host[name] = to_host(*src.weights.find(name));
      if ((fixed && !stats.count(name)) || (f.gptq && hessians.find(name) == nullptr)) {
        return fail(invalid_argument("calibration saw no input of " + name));
      }
    }
    if (cfg.rope_interleaved) {
      unpermute_rope_rows(&host[layer_name(i, "attn_q")], cfg.head_dim);
      unpermute_rope_rows(&host[layer_name(i, "attn_k")], cfg.head_dim);
      // The calibration saw the permuted rows' outputs, not their inputs: the stats stand.
    }
  }
  if (f.smooth_alpha >= 0) {
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
  }

  SafetensorsWriter out;
  ThreadPool pool;
  GptqFactors factors(&pool, f.act_order);
  std::map<std::string, int> kinds;
  uint64_t bytes_out = 0;
  for (const auto& [name, t] : src.weights.all()) {
    const std::optional<std::string> hf = hf_name_from_canonical(name);
    if (!hf) return fail(invalid_argument(f.input + ": tensor " + name + " has no Hugging Face name"));
    auto it = host.find(name);
    if (it == host.end()) {
      Tensor copy = t;
      if (cfg.rope_interleaved && (name.ends_with("attn_q.bias") || name.ends_with("attn_k.bias"))) {
        return fail(invalid_argument(f.input + ": Q/K biases in a GGUF llama file are not supported"));
      }
      out.add_tensor(*hf, copy);
      bytes_out += static_cast<uint64_t>(t.nbytes());
      ++kinds[std::string(dtype_name(t.dtype))];
      continue;
    }
    Host& w = it->second;
    const bool projection = name.ends_with("_q.weight") || name.ends_with("_k.weight") || name.ends_with("_v.weight") ||
                            name.ends_with("attn_output.weight") || name.ends_with("ffn_gate.weight") ||
                            name.ends_with("ffn_up.weight") || name.ends_with("ffn_down.weight");
    const std::vector<int64_t> shape = t.ndim == 1 ? std::vector<int64_t>{w.cols} : std::vector<int64_t>{w.rows, w.cols};
    if (!projection) {  // a smoothed norm
      out.add_tensor(*hf, DType::kF32, shape, bytes_of(w.v.data(), w.v.size()));
      bytes_out += w.v.size() * 4;
      ++kinds["f32 (smoothed)"];
      continue;
    }
    if (bits == 4 && w.cols % 2 != 0) {
      return fail(invalid_argument(f.input + ": tensor " + name + " has rows of " + std::to_string(w.cols) +
                                   " values, not whole int4 pairs"));
    }
    const int64_t group = bits == 4 ? quant_mix_int_group(*mix, w.cols) : w.cols;
    const int64_t groups = w.cols / group;
    std::vector<uint8_t> codes(static_cast<size_t>(w.rows * w.cols));
    std::vector<float> scales(static_cast<size_t>(w.rows * groups));
    if (f.gptq) {
      auto factor = factors.get(hessians, name, group);
      if (!factor.ok()) return fail(factor.status());
      gptq_quantize_int(w.v.data(), w.rows, w.cols, bits, group, (*factor)->u, reinterpret_cast<int8_t*>(codes.data()),
                        scales.data(), &pool, (*factor)->order);
    } else {
      for (int64_t r = 0; r < w.rows; ++r) {
        quantize_weight_row_symmetric(w.row(r), w.cols, bits, group, reinterpret_cast<int8_t*>(codes.data()) + r * w.cols,
                                      scales.data() + r * groups);
      }
    }
    const std::string base = hf->substr(0, hf->size() - 6);
    out.add_tensor(*hf, DType::kI8, shape, codes);
    out.add_tensor(base + "weight_scale", DType::kF32, {w.rows, groups}, bytes_of(scales.data(), scales.size()));
    bytes_out += codes.size() + scales.size() * 4;
    if (fixed) {
      const std::vector<float>& mx = stats[name];
      const float amax = mx.empty() ? 0.0f : *std::max_element(mx.begin(), mx.end());
      const float input_scale = amax > 0 ? amax / 127.0f : 1.0f / 127.0f;
      out.add_tensor(base + "input_scale", DType::kF32, {1}, bytes_of(&input_scale, 1));
    }
    ++kinds[std::string(bits == 8 ? "w8a8" : "w4a8") + (group == w.cols ? "" : " g" + std::to_string(group))];
  }

  // config.json: the input's (with quantization_config) or one written from the GGUF metadata.
  std::error_code ec;
  fs::create_directories(f.output, ec);
  if (ec) return fail(invalid_argument(f.output + ": cannot create the folder: " + ec.message()));
  json config;
  const bool hf_input = fs::is_directory(f.input);
  if (hf_input) {
    std::ifstream in(fs::path(f.input) / "config.json");
    config = json::parse(in, nullptr, false);
    if (config.is_discarded() || !config.is_object()) return fail(invalid_argument(f.input + "/config.json: not a JSON object"));
  } else {
    config = hf_config_from(cfg);
  }
  json weights = {{"num_bits", bits}, {"type", "int"}, {"symmetric", true}, {"dynamic", false}};
  if (bits == 8) {
    weights["strategy"] = "channel";
  } else {
    weights["strategy"] = "group";
    weights["group_size"] = mix->int_group_size;
  }
  json acts = {{"num_bits", 8}, {"type", "int"}, {"symmetric", true}, {"strategy", fixed ? "tensor" : "token"},
               {"dynamic", !fixed}};
  config["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"format", "int-quantized"},
      {"quantization_status", "compressed"},
      {"ignore", {"lm_head"}},
      {"config_groups", {{"group_0", {{"targets", {"Linear"}}, {"weights", weights}, {"input_activations", acts}}}}}};
  {
    std::ofstream c(fs::path(f.output) / "config.json");
    c << config.dump(2) << "\n";
    if (!c) return fail(invalid_argument(f.output + "/config.json: cannot write"));
  }
  if (Status st = out.write((fs::path(f.output) / "model.safetensors").string()); !st.ok()) return fail(st);
  int copied = 0;
  if (hf_input) {
    for (const char* file : {"tokenizer.json", "tokenizer_config.json", "generation_config.json", "special_tokens_map.json",
                             "tokenizer.model", "chat_template.jinja", "vocab.json", "merges.txt"}) {
      const fs::path from = fs::path(f.input) / file;
      if (!fs::is_regular_file(from)) continue;
      fs::copy_file(from, fs::path(f.output) / file, fs::copy_options::overwrite_existing, ec);
      if (ec) return fail(invalid_argument(from.string() + ": cannot copy: " + ec.message()));
      ++copied;
    }
  }
  std::string summary;
  for (const auto& [kind, count] : kinds) summary += (summary.empty() ? "" : ", ") + std::to_string(count) + " " + kind;
  std::printf("%s -> %s (compressed-tensors int-quantized, %s activations%s%s): %s; tensor data %.2f MB\n", f.input.c_str(),
              f.output.c_str(), fixed ? "static per-tensor" : "per-token", f.smooth_alpha >= 0 ? ", smoothed" : "",
              f.gptq ? ", GPTQ weights" : "",
              summary.c_str(), static_cast<double>(bytes_out) / 1e6);
  if (!hf_input) {
    std::printf("note: %s has no tokenizer files; serve it with --tokenizer %s\n", f.output.c_str(), f.input.c_str());
  } else {
    std::printf("copied config.json and %d tokenizer files\n", copied);
  }
  return 0;
}

}  // namespace pagoda::app
