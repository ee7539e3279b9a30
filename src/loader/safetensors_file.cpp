#include "loader/safetensors_file.h"

#include <cstring>
#include <filesystem>

#include "base/checked_math.h"
#include "loader/json_util.h"

namespace pagoda {

using nlohmann::json;
using loader_internal::parse_json;

namespace {

constexpr uint64_t kMaxHeaderLen = 100ull << 20;
constexpr uint64_t kMaxDim = 1ull << 62;
constexpr int kMaxHeaderDepth = 8;  // {name: {shape: [...]}} needs 3

std::optional<DType> dtype_from_safetensors(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  if (name == "I8") return DType::kI8;
  if (name == "I32") return DType::kI32;
  if (name == "I64") return DType::kI64;
  return std::nullopt;
}

// A non-negative JSON integer below kMaxDim, or false.
bool json_u62(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
  } else if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
  } else {
    return false;
  }
  return *out < kMaxDim;
}

}  // namespace

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::open(const std::string& path) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::open(path));
  std::unique_ptr<SafetensorsFile> out(new SafetensorsFile());
  out->file_ = std::move(mapped);
  const uint8_t* data = out->file_->data();
  const uint64_t size = out->file_->size();
  auto corrupt = [&](const std::string& what) { return data_loss(path + ": " + what); };

  if (size < 8) return corrupt("truncated: header length ends past the end of the file (size " + std::to_string(size) + ")");
  uint64_t header_len;
  std::memcpy(&header_len, data, 8);
  if (header_len > kMaxHeaderLen) {
    return corrupt("header length " + std::to_string(header_len) + " exceeds the limit of " +
                   std::to_string(kMaxHeaderLen));
  }
  if (header_len > size - 8) {
    return corrupt("truncated: header of " + std::to_string(header_len) +
                   " bytes ends past the end of the file (size " + std::to_string(size) + ")");
  }
  const uint64_t data_start = 8 + header_len;
  const uint64_t data_size = size - data_start;
  std::string_view text(reinterpret_cast<const char*>(data + 8), header_len);
  PAGODA_ASSIGN_OR_RETURN(json header, parse_json(text, path, kMaxHeaderDepth));
  if (!header.is_object()) return corrupt("header is not a JSON object");

  try {
    for (const auto& [name, entry] : header.items()) {
      if (name == "__metadata__") {
        if (!entry.is_object()) return corrupt("__metadata__ is not an object");
        for (const auto& [k, v] : entry.items()) {
          if (v.is_string()) out->metadata_[k] = v.get<std::string>();
        }
        continue;
      }
      // A named copy: lambdas capturing structured bindings need clang 16 (the fuzz build is clang).
      const std::string& tensor = name;
      auto bad = [&](const std::string& what) { return corrupt("tensor " + tensor + " " + what); };
      if (!entry.is_object()) return bad("is not an object");
      auto dt = entry.find("dtype");
      auto sh = entry.find("shape");
      auto offs = entry.find("data_offsets");
      if (dt == entry.end() || !dt->is_string()) return bad("has no dtype string");
      if (sh == entry.end() || !sh->is_array()) return bad("has no shape array");
      if (offs == entry.end() || !offs->is_array() || offs->size() != 2) {
        return bad("has no data_offsets [begin, end]");
      }
      std::string dtype_str = dt->get<std::string>();
      std::optional<DType> dtype = dtype_from_safetensors(dtype_str);
      if (!dtype) return unimplemented(path + ": tensor " + name + " has unsupported dtype " + dtype_str);
      if (sh->size() > static_cast<size_t>(kMaxDims)) {
        return unimplemented(path + ": tensor " + name + " has " + std::to_string(sh->size()) +
                             " dims (at most " + std::to_string(kMaxDims) + " are supported)");
      }
      SafetensorsTensor t;
      t.name = name;
      t.tensor.dtype = *dtype;
      t.tensor.ndim = static_cast<int>(sh->size());
      uint64_t numel = 1;
      for (size_t d = 0; d < sh->size(); ++d) {
        uint64_t dim;
        if (!json_u62((*sh)[d], &dim)) return bad("has an invalid shape");
        if (!checked_mul(numel, dim, &numel) || numel >= kMaxDim) return bad("has too many elements");
        t.tensor.shape[d] = static_cast<int64_t>(dim);
      }
      if (!json_u62((*offs)[0], &t.begin) || !json_u62((*offs)[1], &t.end)) {
        return bad("has invalid data_offsets");
      }
      if (t.end < t.begin || t.end > data_size) {
        return bad("has data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                   "] outside the data region of " + std::to_string(data_size) + " bytes");
      }
      std::optional<uint64_t> nbytes = dtype_bytes(*dtype, numel);
      if (!nbytes || *nbytes != t.end - t.begin) {
        return bad("has " + std::to_string(t.end - t.begin) + " bytes of data, but shape " +
                   t.tensor.shape_string() + " " + dtype_str + " needs " +
                   (nbytes ? std::to_string(*nbytes) : std::string("more")));
      }
      const uint8_t* p = data + data_start + t.begin;
      // Safetensors does not align tensor data; typed kernels need element alignment.
      if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(block_bytes(*dtype)) != 0) {
        auto copy = std::make_shared<Buffer>(*nbytes);
        if (*nbytes) std::memcpy(copy->data(), p, *nbytes);
        t.tensor.data = copy->data();
        out->copies_.push_back(std::move(copy));
      } else {
        t.tensor.data = const_cast<uint8_t*>(p);
      }
      out->index_.emplace(name, out->tensors_.size());
      out->tensors_.push_back(std::move(t));
    }
  } catch (const std::exception& e) {  // nlohmann accessors; not expected after the checks
    return corrupt(std::string("invalid header: ") + e.what());
  }
  return out;
}

const SafetensorsTensor* SafetensorsFile::find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

Result<SafetensorsCheckpoint> open_safetensors_index(const std::string& index_path) {
  namespace fs = std::filesystem;
  PAGODA_ASSIGN_OR_RETURN(std::string text, read_file(index_path));
  PAGODA_ASSIGN_OR_RETURN(json index, parse_json(text, index_path, 16));
  auto corrupt = [&](const std::string& what) { return data_loss(index_path + ": " + what); };
  if (!index.is_object()) return corrupt("not a JSON object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) return corrupt("has no weight_map object");

  SafetensorsCheckpoint out;
  out.source = index_path;
  const fs::path dir = fs::path(index_path).parent_path();
  std::map<std::string, std::shared_ptr<const SafetensorsFile>> shards;
  try {
    for (const auto& [name, file] : wm->items()) {
      if (!file.is_string()) return corrupt("weight_map entry " + name + " is not a file name");
      std::string rel = file.get<std::string>();
      fs::path rel_path(rel);
      bool escapes = rel.empty() || rel_path.is_absolute();
      for (const auto& part : rel_path) escapes = escapes || part == "..";
      if (escapes) return corrupt("weight_map entry " + name + " names an invalid shard '" + rel + "'");
      auto it = shards.find(rel);
      if (it == shards.end()) {
        PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> shard,
                                SafetensorsFile::open((dir / rel_path).string()));
        it = shards.emplace(rel, std::shared_ptr<const SafetensorsFile>(std::move(shard))).first;
        out.files.push_back(it->second);
      }
      const SafetensorsTensor* t = it->second->find(name);
      if (!t) {
        return data_loss(it->second->path() + ": missing tensor " + name + " (listed in " +
                         index_path + ")");
      }
      out.tensors[name] = t->tensor;
    }
  } catch (const std::exception& e) {
    return corrupt(std::string("invalid index: ") + e.what());
  }
  return out;
}

Result<SafetensorsCheckpoint> open_safetensors_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  std::string single = (fs::path(dir) / "model.safetensors").string();
  if (fs::exists(single, ec)) {
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::open(single));
    SafetensorsCheckpoint out;
    out.source = single;
    for (const SafetensorsTensor& t : file->tensors()) out.tensors[t.name] = t.tensor;
    out.files.push_back(std::shared_ptr<const SafetensorsFile>(std::move(file)));
    return out;
  }
  std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(index, ec)) return open_safetensors_index(index);
  return not_found(dir + ": no model.safetensors or model.safetensors.index.json");
}

}  // namespace pagoda
