#include "launch/model_loading.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <utility>

#include <nlohmann/json.hpp>

#include "launch/engine_flags.h"
#include "backend/cpu/cpu_thread_pool.h"
#include "base/log.h"
#include "base/mapped_file.h"
#include "base/memory_info.h"
#include "loader/config_parsers.h"
#include "loader/gguf_file.h"
#include "model/quant/quant_method.h"
#include "tokenizer/chat_template.h"

namespace pagoda::app {

namespace {

// A checkpoint method --quantization may name (vLLM's names; the Marlin ones are its GPU kernels'
// names for the same checkpoints), as config.json's quant_method spells it; "" for other values.
std::string checkpoint_method(const std::string& flag) {
  const std::optional<QuantizationFlag> f = parse_quantization_flag(flag);
  return f && f->kind == QuantizationFlag::Kind::kCheckpoint ? f->checkpoint_method : "";
}

}  // namespace

Status ModelFlags::apply_config_overrides(ModelConfig* c) const {
  if (!hf_overrides.empty()) PAGODA_RETURN_IF_ERROR(apply_hf_overrides(hf_overrides, "--hf-overrides", c));
  if (!rope_scaling.empty()) {
    // Parsed on its own first, so that nothing but one rope_scaling object (or null) gets through.
    const nlohmann::json scaling = nlohmann::json::parse(rope_scaling, nullptr, /*allow_exceptions=*/false);
    if (scaling.is_discarded() || !(scaling.is_object() || scaling.is_null())) {
      return invalid_argument("--rope-scaling must be a JSON object (config.json's rope_scaling), got " + rope_scaling);
    }
    PAGODA_RETURN_IF_ERROR(apply_hf_overrides(nlohmann::json{{"rope_scaling", scaling}}.dump(), "--rope-scaling", c));
  }
  if (rope_theta) {
    if (!(*rope_theta > 0) || !std::isfinite(*rope_theta)) {
      return invalid_argument("--rope-theta must be a positive number, got " + std::to_string(*rope_theta));
    }
    c->rope_theta = *rope_theta;
  }
  return {};
}

Status ModelFlags::check() const {
  if (model.empty()) {
    return invalid_argument("no model given: pass a GGUF file, a Hugging Face directory or a built-in config name");
  }
  {
    // The overrides' JSON and keys, checked on a stand-in config before anything is read.
    ModelConfig probe = *dummy_preset("demo-random");
    PAGODA_RETURN_IF_ERROR(apply_config_overrides(&probe));
  }
  if (quantization == "fp8" || quantization == "fbgemm_fp8" || quantization == "modelopt") {
    return unimplemented("--quantization " + quantization +
                         ": fp8 weights are not a CPU type (supported: int8 and int4 codes as w8a8 / w4a8, awq, "
                         "gptq, compressed-tensors; llama-quantize's types; --kv-cache-dtype fp8 for the KV cache)");
  }
  if (const std::string named = checkpoint_method(quantization); !named.empty()) {
    // The checkpoint must declare the method: its config.json is read now, before the weights
    // (and a server's port); a config that does not parse is left for loading to report.
    const std::filesystem::path config = std::filesystem::path(model) / "config.json";
    std::string declared;
    if (std::error_code ec; std::filesystem::is_regular_file(config, ec)) {
      if (auto c = config_from_hf_file(config.string()); c.ok()) {
        declared = c->quantization.method;
      } else {
        declared = named;
      }
    }
    if (declared.empty()) {
      return invalid_argument("--quantization " + quantization + ": " + model + " declares no " + named +
                              " quantization_config in its config.json");
    }
  }
  const std::optional<QuantizationFlag> flag = parse_quantization_flag(quantization);
  if (!flag || flag->kind == QuantizationFlag::Kind::kGguf) {
    const bool gguf_file = flag && std::filesystem::is_regular_file(model) && starts_with_gguf_magic(model);
    if (!gguf_file) {
      std::string file_types;
      for (const std::string& n : llama_file_type_names()) file_types += ", " + n;
      return unimplemented("--quantization " + quantization +
                           " is not supported yet (supported: none; gguf for a GGUF file, whose F32/F16/BF16, "
                           "Q8_0, Q4_0/Q4_1/Q5_0/Q5_1 and Q2_K..Q6_K tensors run as stored; awq, gptq and "
                           "compressed-tensors for checkpoints declaring them; w8a8 and w4a8, and llama-quantize's "
                           "file types, applied to "
                           "float weights at load" + file_types + ")");
    }
  }
  if (tokenizer_mode != "auto" && tokenizer_mode != "slow" && tokenizer_mode != "hf") {
    return unimplemented("--tokenizer-mode " + tokenizer_mode + " is not supported yet (supported: auto, slow, hf)");
  }
  return Status::ok_status();
}

void ModelFlags::warn_no_effect() const {
  for (const auto& [flag, value] : {std::pair<const char*, const std::string&>{"--revision", revision},
                                    {"--tokenizer-revision", tokenizer_revision},
                                    {"--code-revision", code_revision},
                                    {"--download-dir", download_dir}}) {
    if (!value.empty()) {
      log_line(LogLevel::kWarning, "model", std::string(flag) + " " + value + " has no effect: Pagoda downloads nothing and reads " +
                                                model + " as it is");
    }
  }
}

namespace {

// A --dtype value: vLLM's names (float32, float, float16, half, bfloat16) or ours (dtype_name).
Result<DType> parse_dtype_flag(const std::string& name) {
  static const std::pair<const char*, DType> kAliases[] = {
      {"float32", DType::kF32}, {"float", DType::kF32},     {"float16", DType::kF16},
      {"half", DType::kF16},    {"bfloat16", DType::kBF16},
  };
  for (const auto& [alias, t] : kAliases) {
    if (name == alias) return t;
  }
  if (auto t = dtype_from_name(name); t && dtype_traits(*t).dense_matmul) return *t;
  std::string names;
  for (const DTypeTraits& t : all_dtypes()) {
    if (t.dense_matmul) names += ", " + std::string(t.name);
  }
  return invalid_argument("unknown --dtype '" + name + "' (auto, float32, float16, bfloat16" + names + ")");
}

Result<std::unique_ptr<Tokenizer>> tokenizer_from(const std::string& path) {
  namespace fs = std::filesystem;
  if (path == "demo-random") return make_byte_tokenizer();
  if (fs::is_directory(path)) return load_hf_tokenizer(path);
  if (fs::is_regular_file(path) && starts_with_gguf_magic(path)) {
    PAGODA_ASSIGN_OR_RETURN(auto gguf, GgufFile::open(path));
    return load_gguf_tokenizer(*gguf);
  }
  if (!fs::exists(path)) {
    if (dummy_preset(path)) {
      return not_found("the built-in config '" + path + "' has no tokenizer: pass --tokenizer PATH");
    }
    return not_found(path + ": no such file or directory");
  }
  return invalid_argument(path + ": not a GGUF file or a Hugging Face directory");
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tokenizer(const ModelFlags& flags) {
  if (flags.tokenizer.empty() && flags.byte_tokenizer_fallback && !std::filesystem::exists(flags.model) &&
      dummy_preset(flags.model)) {
    return make_byte_tokenizer();
  }
  return tokenizer_from(flags.tokenizer.empty() ? flags.model : flags.tokenizer);
}

namespace {

// load_model_and_tokenizer, or (with_tokenizer false) load_model_shard.
Result<LoadedModel> load(const ModelFlags& flags, bool with_tokenizer,
                         const std::function<Status(const Tokenizer&)>& before_weights, const TensorParallel& tp,
                         const PipelineParallel& pp) {
  PAGODA_RETURN_IF_ERROR(flags.check());
  LoadedModel out;
  if (with_tokenizer) {
    flags.warn_no_effect();
    PAGODA_ASSIGN_OR_RETURN(out.tokenizer, load_tokenizer(flags));
    if (before_weights) PAGODA_RETURN_IF_ERROR(before_weights(*out.tokenizer));
  }
  LoadOptions options;
  PAGODA_ASSIGN_OR_RETURN(options.format, parse_load_format(flags.load_format));
  // A built-in config name can only mean dummy weights.
  if (options.format == LoadFormat::kAuto && !std::filesystem::exists(flags.model) &&
      dummy_preset(flags.model)) {
    options.format = LoadFormat::kDummy;
  }
  std::optional<QuantMix> mix;  // the types float weights get at load
  if (flags.dtype != "auto") {
    PAGODA_ASSIGN_OR_RETURN(const DType t, parse_dtype_flag(flags.dtype));
    options.dummy_dtype = t;
    mix = uniform_mix(t);
  } else if (auto preset = dummy_preset(flags.model); preset && preset->num_parameters() > 200'000'000) {
    options.dummy_dtype = DType::kBF16;  // what such checkpoints ship in; f32 would double the memory
  }
  options.dummy_seed = flags.weights_seed;
  // A built-in shape's dummy weights are made in memory: say so before allocating what cannot fit.
  if (auto preset = dummy_preset(flags.model); preset && options.format == LoadFormat::kDummy) {
    const double need = static_cast<double>(dummy_weight_bytes(*preset, options.dummy_dtype));
    const double have = static_cast<double>(total_memory_bytes());
    if (need > 0.9 * have) {
      char msg[256];
      std::snprintf(msg, sizeof msg, "%s: dummy weights in %s need %.1f GiB, more than 90%% of this machine's %.1f GiB",
                    flags.model.c_str(), std::string(dtype_name(options.dummy_dtype)).c_str(), need / (1 << 30),
                    have / (1 << 30));
      return resource_exhausted(std::string(msg) + " (a smaller --dtype: q4_0, q4_k, ...)");
    }
  }
  if (const std::optional<QuantizationFlag> f = parse_quantization_flag(flags.quantization); f && f->mix) mix = f->mix;

  PAGODA_ASSIGN_OR_RETURN(out.backend, create_backend(flags.backend, BackendOptions{flags.threads}));
  PAGODA_ASSIGN_OR_RETURN(ModelSource source, load_model(flags.model, options));
  PAGODA_RETURN_IF_ERROR(flags.apply_config_overrides(&source.config));
  // As vLLM: a checkpoint's declared method and --quantization must agree.
  const std::string& declared = source.config.quantization.method;
  const std::string named = checkpoint_method(flags.quantization);
  if (!named.empty() && declared.empty()) {
    return invalid_argument("--quantization " + flags.quantization + ": " + flags.model + " declares no " + named +
                            " quantization_config in its config.json");
  }
  if (!declared.empty() && !flags.quantization.empty() && flags.quantization != "none" && named != declared) {
    return invalid_argument("the quantization method of " + flags.model + " (" + declared +
                            ", from its config.json) does not match --quantization " + flags.quantization);
  }
  out.weights_fingerprint = weights_fingerprint(source.weights);
  PAGODA_ASSIGN_OR_RETURN(out.model, create_model(std::move(source), *out.backend, tp, pp, std::move(mix)));
  if (out.tokenizer && out.tokenizer->vocab_size() > out.model->config().vocab_size) {
    return invalid_argument("the tokenizer has " + std::to_string(out.tokenizer->vocab_size()) +
                            " tokens but the model only " +
                            std::to_string(out.model->config().vocab_size));
  }
  return out;
}

}  // namespace

Result<LoadedModel> load_model_and_tokenizer(const ModelFlags& flags,
                                             const std::function<Status(const Tokenizer&)>& before_weights,
                                             const TensorParallel& tp, const PipelineParallel& pp) {
  return load(flags, /*with_tokenizer=*/true, before_weights, tp, pp);
}

Result<LoadedModel> load_model_shard(const ModelFlags& flags, const TensorParallel& tp, const PipelineParallel& pp) {
  return load(flags, /*with_tokenizer=*/false, {}, tp, pp);
}

namespace {

// The chat template of the built-in configs' byte tokenizer (demo-random, which `make run`
// serves): role tags on lines of their own, an assistant turn ending in EOS, and tools and tool
// calls in the <tool_call> JSON form that Qwen's (hermes) templates use.
// Written for Hugging Face's rendering (trim_blocks and lstrip_blocks, as every template here is
// rendered): every newline of the output is a '\n' string, the template's own line breaks are not.
constexpr const char* kByteTokenizerChatTemplate = R"TEMPLATE({{- bos_token }}
{%- if tools %}
  {{- '<|system|>\nYou may call these tools. To call one, answer <tool_call>{"name": <name>, "arguments": <arguments>}</tool_call>.\n' }}
  {%- for tool in tools %}
    {{- tool | tojson }}{{ '\n' }}
  {%- endfor %}
{%- endif %}
{%- for message in messages %}
  {{- '<|' + message['role'] + '|>\n' }}
  {%- if message['content'] is string %}{{ message['content'] }}{% endif %}
  {%- if message['tool_calls'] is defined and message['tool_calls'] %}
    {%- for call in message['tool_calls'] %}
      {{- '<tool_call>{"name": ' }}{{ call['function']['name'] | tojson }}{{ ', "arguments": ' }}
      {%- if call['function']['arguments'] is string %}{{ call['function']['arguments'] }}
      {%- else %}{{ call['function']['arguments'] | tojson }}{% endif %}
      {{- '}</tool_call>' }}
    {%- endfor %}
  {%- endif %}
  {%- if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}
  {{- '\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %})TEMPLATE";

}  // namespace

Result<ChatTemplateSource> find_chat_template(const std::string& chat_template, const ModelFlags& flags,
                                              const Tokenizer& tok) {
  namespace fs = std::filesystem;
  ChatTemplateSource out;
  auto token_text = [&](std::optional<TokenId> id) { return id ? tok.token_text(*id) : std::string(); };
  out.bos = token_text(tok.bos_id());
  out.eos = token_text(tok.eos_id());
  if (!chat_template.empty()) {
    if (fs::is_regular_file(chat_template)) {
      PAGODA_ASSIGN_OR_RETURN(out.text, read_file(chat_template));
    } else if (chat_template.find("{{") != std::string::npos || chat_template.find("{%") != std::string::npos) {
      out.text = chat_template;
    } else {
      return not_found("--chat-template '" + chat_template + "' is neither a file nor a template");
    }
    return out;
  }
  const std::string& path = flags.tokenizer.empty() ? flags.model : flags.tokenizer;
  if (!fs::exists(path) && dummy_preset(path)) {  // a built-in config with the byte tokenizer
    out.text = kByteTokenizerChatTemplate;
    return out;
  }
  if (fs::is_directory(path)) {
    const std::string config = (fs::path(path) / "tokenizer_config.json").string();
    if (!fs::exists(config)) return out;
    auto hf = load_chat_template_from_hf_config(config);
    if (!hf.ok()) {
      if (hf.status().code() == StatusCode::kNotFound) return out;
      return hf.status();
    }
    out.text = hf->chat_template;
    if (!hf->bos_token.empty()) out.bos = hf->bos_token;
    if (!hf->eos_token.empty()) out.eos = hf->eos_token;
  } else if (fs::is_regular_file(path) && starts_with_gguf_magic(path)) {
    PAGODA_ASSIGN_OR_RETURN(auto gguf, GgufFile::open(path));
    auto text = gguf->get_string("tokenizer.chat_template");
    if (text.ok()) out.text = *text;
  }
  return out;
}

ModelFlags draft_flags(const ModelFlags& model, const SpeculativeConfig& spec) {
  ModelFlags d = model;
  d.model = spec.model;
  d.tokenizer.clear();
  d.quantization = spec.quantization;
  // The config overrides name the target's fields; the draft keeps its own config.
  d.hf_overrides.clear();
  d.rope_scaling.clear();
  d.rope_theta.reset();
  return d;
}

Result<std::unique_ptr<Model>> load_draft_model(const ModelFlags& draft) {
  Result<LoadedModel> d = load_model_shard(draft, {}, {});
  if (!d.ok()) {
    return Status(d.status().code(), "--speculative-config: draft model " + draft.model + ": " + d.status().message());
  }
  return std::move(d->model);
}

}  // namespace pagoda::app
