#include "loader/safetensors_writer.h"

#include <cstring>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "loader/gguf_writer.h"

namespace pagoda {

namespace {
std::string safetensors_dtype(DType t) {
  const std::string_view name = dtype_traits(t).safetensors_name;
  PAGODA_CHECK(!name.empty() && "safetensors holds only f32, f16, bf16, i8, i32 and i64");
  return std::string(name);
}
}  // namespace

void SafetensorsWriter::add_tensor(const std::string& name, DType dtype,
                                   const std::vector<int64_t>& shape, std::span<const uint8_t> bytes) {
  safetensors_dtype(dtype);  // checks the type
  PAGODA_CHECK(shape.size() <= static_cast<size_t>(kMaxDims));
  PAGODA_CHECK(name != "__metadata__");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    PAGODA_CHECK(d >= 0);
    numel *= static_cast<uint64_t>(d);
  }
  PAGODA_CHECK(numel * static_cast<uint64_t>(block_bytes(dtype)) == bytes.size());
  for (const PendingTensor& t : tensors_) PAGODA_CHECK(t.name != name);
  uint64_t begin = data_.size();
  data_.insert(data_.end(), bytes.begin(), bytes.end());
  tensors_.push_back({name, dtype, shape, begin, data_.size()});
}

void SafetensorsWriter::add_tensor(const std::string& name, const Tensor& tensor) {
  std::vector<int64_t> shape(tensor.shape.begin(), tensor.shape.begin() + tensor.ndim);
  add_tensor(name, tensor.dtype, shape,
             std::span<const uint8_t>(static_cast<const uint8_t*>(tensor.data),
                                      static_cast<size_t>(tensor.nbytes())));
}

void SafetensorsWriter::add_metadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::vector<uint8_t> SafetensorsWriter::to_bytes() const {
  nlohmann::json header = nlohmann::json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  for (const PendingTensor& t : tensors_) {
    header[t.name] = {{"dtype", safetensors_dtype(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {t.begin, t.end}}};
  }
  std::string text = header.dump();
  text.resize((text.size() + 7) / 8 * 8, ' ');
  // Sized once and filled with memcpy (GCC 12 at -O3 misreports inserts into a small vector).
  std::vector<uint8_t> out(8 + text.size() + data_.size());
  uint64_t len = text.size();
  std::memcpy(out.data(), &len, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  if (!data_.empty()) std::memcpy(out.data() + 8 + text.size(), data_.data(), data_.size());
  return out;
}

Status SafetensorsWriter::write(const std::string& path) const { return write_file(path, to_bytes()); }

}  // namespace pagoda
