#include "loader/gguf_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "base/check.h"

namespace pagoda {

namespace {

// resize + memcpy rather than insert: GCC 12 at -O3 reports a false stringop-overflow for
// inserting a few bytes into an empty vector.
void append_bytes(std::vector<uint8_t>* out, const void* data, size_t n) {
  size_t at = out->size();
  out->resize(at + n);
  std::memcpy(out->data() + at, data, n);
}
void append_u32(std::vector<uint8_t>* out, uint32_t v) { append_bytes(out, &v, 4); }
void append_u64(std::vector<uint8_t>* out, uint64_t v) { append_bytes(out, &v, 8); }
void append_string(std::vector<uint8_t>* out, const std::string& s) {
  append_u64(out, s.size());
  out->insert(out->end(), s.begin(), s.end());
}
template <typename T>
void append_raw(std::vector<uint8_t>* out, const T& v) {
  append_bytes(out, &v, sizeof(T));
}
void pad_to(std::vector<uint8_t>* out, uint64_t alignment) {
  out->resize((out->size() + alignment - 1) / alignment * alignment, 0);
}

}  // namespace

void GgufWriter::begin_kv(const std::string& key, GgufType type) {
  PAGODA_CHECK(std::find(keys_.begin(), keys_.end(), key) == keys_.end());
  keys_.push_back(key);
  ++num_kv_;
  put_string(key);
  put_u32(static_cast<uint32_t>(type));
}
void GgufWriter::put_u32(uint32_t v) { append_u32(&kv_, v); }
void GgufWriter::put_u64(uint64_t v) { append_u64(&kv_, v); }
void GgufWriter::put_string(const std::string& s) { append_string(&kv_, s); }

void GgufWriter::add_string(const std::string& key, const std::string& value) {
  begin_kv(key, GgufType::kString);
  put_string(value);
}
void GgufWriter::add_u32(const std::string& key, uint32_t value) {
  begin_kv(key, GgufType::kUint32);
  put_u32(value);
}
void GgufWriter::add_i32(const std::string& key, int32_t value) {
  begin_kv(key, GgufType::kInt32);
  append_raw(&kv_, value);
}
void GgufWriter::add_f32(const std::string& key, float value) {
  begin_kv(key, GgufType::kFloat32);
  append_raw(&kv_, value);
}
void GgufWriter::add_bool(const std::string& key, bool value) {
  begin_kv(key, GgufType::kBool);
  kv_.push_back(value ? 1 : 0);
}
void GgufWriter::add_u64(const std::string& key, uint64_t value) {
  begin_kv(key, GgufType::kUint64);
  put_u64(value);
}
bool GgufWriter::add_value(const std::string& key, const GgufValue& v) {
  if (v.type == GgufType::kArray && v.elem_type == GgufType::kArray) return false;
  begin_kv(key, v.type);
  switch (v.type) {
    case GgufType::kUint8: append_raw(&kv_, static_cast<uint8_t>(v.u)); break;
    case GgufType::kInt8: append_raw(&kv_, static_cast<int8_t>(v.i)); break;
    case GgufType::kUint16: append_raw(&kv_, static_cast<uint16_t>(v.u)); break;
    case GgufType::kInt16: append_raw(&kv_, static_cast<int16_t>(v.i)); break;
    case GgufType::kUint32: append_raw(&kv_, static_cast<uint32_t>(v.u)); break;
    case GgufType::kInt32: append_raw(&kv_, static_cast<int32_t>(v.i)); break;
    case GgufType::kUint64: append_raw(&kv_, v.u); break;
    case GgufType::kInt64: append_raw(&kv_, v.i); break;
    case GgufType::kFloat32: append_raw(&kv_, static_cast<float>(v.f)); break;
    case GgufType::kFloat64: append_raw(&kv_, v.f); break;
    case GgufType::kBool: append_raw(&kv_, static_cast<uint8_t>(v.b ? 1 : 0)); break;
    case GgufType::kString: put_string(std::string(v.s)); break;
    case GgufType::kArray:
      put_u32(static_cast<uint32_t>(v.elem_type));
      put_u64(v.count);
      if (v.elem_type == GgufType::kString) {
        for (std::string_view s : v.strings) put_string(std::string(s));
      } else {
        const uint64_t size = v.count * gguf_scalar_size(v.elem_type);
        kv_.insert(kv_.end(), v.raw, v.raw + size);
      }
      break;
  }
  return true;
}

void GgufWriter::add_string_array(const std::string& key, const std::vector<std::string>& values) {
  begin_kv(key, GgufType::kArray);
  put_u32(static_cast<uint32_t>(GgufType::kString));
  put_u64(values.size());
  for (const std::string& v : values) put_string(v);
}
void GgufWriter::add_f32_array(const std::string& key, const std::vector<float>& values) {
  begin_kv(key, GgufType::kArray);
  put_u32(static_cast<uint32_t>(GgufType::kFloat32));
  put_u64(values.size());
  for (float v : values) append_raw(&kv_, v);
}
void GgufWriter::add_i32_array(const std::string& key, const std::vector<int32_t>& values) {
  begin_kv(key, GgufType::kArray);
  put_u32(static_cast<uint32_t>(GgufType::kInt32));
  put_u64(values.size());
  for (int32_t v : values) append_raw(&kv_, v);
}

void GgufWriter::add_tensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                            std::span<const uint8_t> bytes) {
  PAGODA_CHECK(!shape.empty() && shape.size() <= static_cast<size_t>(kMaxDims));
  uint64_t numel = 1;
  for (int64_t d : shape) {
    PAGODA_CHECK(d > 0);
    numel *= static_cast<uint64_t>(d);
  }
  PAGODA_CHECK(shape.back() % block_elems(dtype) == 0);
  std::optional<uint64_t> expected = dtype_bytes(dtype, numel);
  PAGODA_CHECK(expected && *expected == bytes.size());
  for (const PendingTensor& t : tensors_) PAGODA_CHECK(t.name != name);
  tensors_.push_back({name, dtype, shape, std::vector<uint8_t>(bytes.begin(), bytes.end())});
}

void GgufWriter::add_tensor(const std::string& name, const Tensor& tensor) {
  std::vector<int64_t> shape(tensor.shape.begin(), tensor.shape.begin() + tensor.ndim);
  add_tensor(name, tensor.dtype, shape,
             std::span<const uint8_t>(static_cast<const uint8_t*>(tensor.data),
                                      static_cast<size_t>(tensor.nbytes())));
}

std::vector<uint8_t> GgufWriter::to_bytes() const {
  std::vector<uint8_t> out;
  append_u32(&out, 0x46554747);  // "GGUF"
  append_u32(&out, 3);
  append_u64(&out, tensors_.size());
  append_u64(&out, num_kv_);
  out.insert(out.end(), kv_.begin(), kv_.end());
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    append_string(&out, t.name);
    append_u32(&out, static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) append_u64(&out, static_cast<uint64_t>(*it));
    append_u32(&out, ggml_type_of(t.dtype));
    append_u64(&out, offset);
    offset = (offset + t.bytes.size() + kAlignment - 1) / kAlignment * kAlignment;
  }
  if (tensors_.empty()) return out;  // like llama.cpp's vocab files: no data section at all
  pad_to(&out, kAlignment);
  for (const PendingTensor& t : tensors_) {
    out.insert(out.end(), t.bytes.begin(), t.bytes.end());
    pad_to(&out, kAlignment);
  }
  return out;
}

Status GgufWriter::write(const std::string& path) const { return write_file(path, to_bytes()); }

Status write_file(const std::string& path, std::span<const uint8_t> bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return io_error(path + ": cannot open for writing: " + std::strerror(errno));
  bool ok = bytes.empty() || std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  ok = std::fclose(f) == 0 && ok;
  if (!ok) return io_error(path + ": write failed");
  return {};
}

}  // namespace pagoda
