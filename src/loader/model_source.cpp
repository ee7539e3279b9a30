#include "loader/model_source.h"

#include <algorithm>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>
#include <vector>

#include "loader/config_parsers.h"
#include "loader/gguf_file.h"
#include "loader/safetensors_file.h"

namespace pagoda {

namespace fs = std::filesystem;

bool starts_with_gguf_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

namespace {

enum class PathKind { kMissing, kGguf, kHfDir, kHfConfig, kOther };

// What `path` is on disk: a GGUF file (by magic), an HF directory (has config.json), a
// config.json file, or something else.
PathKind classify(const std::string& path) {
  std::error_code ec;
  fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st)) return PathKind::kMissing;
  if (fs::is_directory(st)) {
    return fs::exists(fs::path(path) / "config.json", ec) ? PathKind::kHfDir : PathKind::kOther;
  }
  if (starts_with_gguf_magic(path)) return PathKind::kGguf;
  if (fs::path(path).filename() == "config.json") return PathKind::kHfConfig;
  return PathKind::kOther;
}

// The HF model directory of a directory or of its config.json.
std::string hf_dir_of(const std::string& path, PathKind kind) {
  if (kind != PathKind::kHfConfig) return path;
  std::string parent = fs::path(path).parent_path().string();
  return parent.empty() ? std::string(".") : parent;
}

Status not_a_model(const std::string& path, PathKind kind) {
  if (kind == PathKind::kMissing) return not_found(path + ": no such file or directory");
  return invalid_argument(path + ": neither a GGUF file nor a Hugging Face model directory with config.json");
}

// llama.cpp stores a sparse layer's experts stacked: blk.N.ffn_{gate,up,down}_exps.weight
// [experts, rows, cols]. Each expert becomes a view blk.N.ffn_{gate,up,down}.e.weight [rows,
// cols] (the per-expert names older Mixtral files use; a block type's rows are whole, so expert e
// starts e * rows rows in), and Qwen2-MoE's shared-expert gate [hidden] a [1, hidden] matrix.
Status split_stacked_experts(const ModelConfig& c, const std::string& path, WeightMap* weights) {
  if (c.num_experts <= 0) return {};
  std::vector<std::pair<std::string, Tensor>> views;
  for (const auto& [name, t] : weights->all()) {
    for (const char* proj : {"ffn_gate", "ffn_up", "ffn_down"}) {
      const std::string suffix = std::string(".") + proj + "_exps.weight";
      if (!name.starts_with("blk.") || !name.ends_with(suffix)) continue;
      if (t.ndim != 3 || t.shape[0] != c.num_experts) {
        return data_loss(path + ": tensor " + name + " has shape " + t.shape_string() + ", expected [" +
                         std::to_string(c.num_experts) + ", rows, cols] (expert_count " +
                         std::to_string(c.num_experts) + ")");
      }
      const std::string prefix = name.substr(0, name.size() - suffix.size() + 1) + proj + ".";
      for (int64_t e = 0; e < c.num_experts; ++e) {
        Tensor v = t;
        v.ndim = 2;
        v.shape = {t.shape[1], t.shape[2]};
        v.data = static_cast<uint8_t*>(t.data) + e * v.nbytes();
        views.emplace_back(prefix + std::to_string(e) + ".weight", v);
      }
    }
    if (name.ends_with(".ffn_gate_inp_shexp.weight") && t.ndim == 1) {
      Tensor v = t;
      v.ndim = 2;
      v.shape = {1, t.shape[0]};
      views.emplace_back(name, v);
    }
  }
  for (auto& [name, v] : views) weights->add(std::move(name), v);
  return {};
}

Result<ModelSource> load_gguf(const std::string& path) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> opened, GgufFile::open(path));
  std::shared_ptr<const GgufFile> gguf(std::move(opened));
  ModelSource src;
  src.path = path;
  src.format = LoadFormat::kGguf;
  PAGODA_ASSIGN_OR_RETURN(src.config, config_from_gguf(*gguf));
  src.weights.set_source(path);
  for (const GgufTensorInfo& t : gguf->tensors()) src.weights.add(t.name, t.tensor);
  src.weights.keep_alive(gguf);  // the file and any aligned copies it made
  PAGODA_RETURN_IF_ERROR(split_stacked_experts(src.config, path, &src.weights));
  PAGODA_RETURN_IF_ERROR(check_weights(src.config, src.weights));
  return src;
}

Result<ModelSource> load_hf(const std::string& path, const std::string& dir) {
  ModelSource src;
  src.path = path;
  src.format = LoadFormat::kSafetensors;
  PAGODA_ASSIGN_OR_RETURN(src.config, config_from_hf_file((fs::path(dir) / "config.json").string()));
  PAGODA_ASSIGN_OR_RETURN(SafetensorsCheckpoint ckpt, open_safetensors_dir(dir));
  src.weights.set_source(dir);
  for (const auto& [name, tensor] : ckpt.tensors) {
    if (std::optional<std::string> canonical = canonical_name_from_hf(name)) {
      src.weights.add(std::move(*canonical), tensor);
    }
  }
  for (auto& file : ckpt.files) src.weights.keep_alive(file);
  PAGODA_RETURN_IF_ERROR(check_weights(src.config, src.weights));
  return src;
}

Result<ModelSource> load_dummy(const std::string& path, const LoadOptions& options) {
  ModelSource src;
  src.path = path;
  src.format = LoadFormat::kDummy;
  PathKind kind = classify(path);
  if (kind == PathKind::kGguf) {
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> gguf, GgufFile::open(path));
    PAGODA_ASSIGN_OR_RETURN(src.config, config_from_gguf(*gguf));
  } else if (kind == PathKind::kHfDir) {
    PAGODA_ASSIGN_OR_RETURN(src.config, config_from_hf_file((fs::path(path) / "config.json").string()));
  } else if (kind == PathKind::kMissing) {
    std::optional<ModelConfig> preset = dummy_preset(path);
    if (!preset) {
      std::string names;
      for (const std::string& n : dummy_presets()) names += (names.empty() ? "" : ", ") + n;
      return not_found(path + ": neither a file nor a dummy preset (presets: " + names + ")");
    }
    src.config = *preset;
  } else if (std::error_code ec; fs::is_directory(path, ec)) {
    return not_a_model(path, kind);
  } else {  // config.json, or any other file: read as a config.json
    PAGODA_ASSIGN_OR_RETURN(src.config, config_from_hf_file(path));
  }
  PAGODA_RETURN_IF_ERROR(src.config.validate(path));
  PAGODA_ASSIGN_OR_RETURN(src.weights,
                          make_dummy_weights(src.config, options.dummy_dtype, options.dummy_seed, path));
  PAGODA_RETURN_IF_ERROR(check_weights(src.config, src.weights));
  return src;
}

}  // namespace

Result<LoadFormat> parse_load_format(const std::string& name) {
  if (name == "auto") return LoadFormat::kAuto;
  if (name == "gguf") return LoadFormat::kGguf;
  if (name == "safetensors") return LoadFormat::kSafetensors;
  if (name == "dummy") return LoadFormat::kDummy;
  return invalid_argument("unknown load format '" + name + "' (expected auto, gguf, safetensors or dummy)");
}

namespace {

// The GGUF file or HF directory at path (format auto, gguf or safetensors).
Result<ModelSource> load_from_files(const std::string& path, const LoadOptions& options) {
  PathKind kind = classify(path);
  switch (options.format) {
    case LoadFormat::kGguf:
      if (kind == PathKind::kMissing) return not_a_model(path, kind);
      return load_gguf(path);  // GgufFile::open reports a bad magic
    case LoadFormat::kSafetensors:
      if (kind != PathKind::kHfDir && kind != PathKind::kHfConfig) {
        if (kind == PathKind::kMissing) return not_a_model(path, kind);
        return invalid_argument(path + ": not a Hugging Face model directory (no config.json)");
      }
      return load_hf(path, hf_dir_of(path, kind));
    default:
      break;
  }
  switch (kind) {
    case PathKind::kGguf: return load_gguf(path);
    case PathKind::kHfDir:
    case PathKind::kHfConfig: return load_hf(path, hf_dir_of(path, kind));
    default: return not_a_model(path, kind);
  }
}

}  // namespace

Result<ModelSource> load_model(const std::string& path, const LoadOptions& options) {
  PAGODA_ASSIGN_OR_RETURN(ModelSource source, options.format == LoadFormat::kDummy ? load_dummy(path, options)
                                                                                   : load_from_files(path, options));
  return source;
}

bool is_expert_router(std::string_view name) {
  auto ends_with = [name](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  return ends_with(".ffn_gate_inp.weight") || ends_with(".ffn_gate_inp_shexp.weight");
}

Sha256Digest weights_fingerprint(const WeightMap& weights) {
  Sha256 h;
  h.update(std::string_view("pagoda weights v1"));
  for (const auto& [name, t] : weights.all()) {
    h.update(std::string_view(name));
    const int64_t header[6] = {static_cast<int64_t>(t.dtype), t.ndim, t.shape[0], t.shape[1], t.shape[2], t.shape[3]};
    h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(header), sizeof header));
    if (t.data == nullptr || t.layout != TensorLayout::kRowMajor) continue;
    const int64_t n = t.nbytes();
    const auto* bytes = static_cast<const uint8_t*>(t.data);
    constexpr int64_t kSample = 256;
    for (int64_t at : {int64_t{0}, std::max<int64_t>(0, n / 2 - kSample / 2), std::max<int64_t>(0, n - kSample)}) {
      h.update(std::span<const uint8_t>(bytes + at, static_cast<size_t>(std::min(kSample, n - at))));
    }
  }
  return h.finish();
}

}  // namespace pagoda
