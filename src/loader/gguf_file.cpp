#include "loader/gguf_file.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <new>
#include <unordered_set>

#include "base/checked_math.h"

namespace pagoda {

static_assert(std::endian::native == std::endian::little, "GGUF parsing assumes a little-endian host");

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" read as a little-endian uint32
constexpr uint64_t kMaxKeyLen = 65535;        // keys are short dotted names
constexpr uint64_t kMaxStringLen = 64ull << 20;
constexpr uint64_t kMaxTensorNameLen = 65536;
constexpr uint64_t kMaxDim = 1ull << 62;      // keeps element counts inside int64
constexpr int kMaxArrayDepth = 4;             // arrays of arrays nest at most this deep
constexpr uint64_t kMaxReserve = 1 << 16;     // never reserve more entries than this up front
// Smallest possible encodings, used to reject impossible counts before reserving memory.
constexpr uint64_t kMinKvBytes = 8 + 1 + 4 + 1;                // key len, 1-byte key, type, u8
constexpr uint64_t kMinTensorInfoBytes = 8 + 1 + 4 + 8 + 4 + 8;  // name, n_dims, 1 dim, type, offset

// Bytes of one value of a fixed-size type; 0 for strings and arrays.
uint64_t scalar_size_of(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kBool: return 1;
    case GgufType::kUint16: case GgufType::kInt16: return 2;
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kFloat32: return 4;
    case GgufType::kUint64: case GgufType::kInt64: case GgufType::kFloat64: return 8;
    case GgufType::kString: case GgufType::kArray: return 0;
  }
  return 0;
}

bool is_integer_type(GgufType t) {
  switch (t) {
    case GgufType::kUint8: case GgufType::kInt8: case GgufType::kUint16: case GgufType::kInt16:
    case GgufType::kUint32: case GgufType::kInt32: case GgufType::kUint64: case GgufType::kInt64:
      return true;
    default:
      return false;
  }
}

bool is_float_type(GgufType t) { return t == GgufType::kFloat32 || t == GgufType::kFloat64; }

constexpr uint32_t kNumGgufTypes = 13;

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Reads element `idx` of a numeric array (or a scalar at p) as int64; false when it does not fit.
bool load_int(GgufType t, const uint8_t* p, int64_t* out) {
  switch (t) {
    case GgufType::kUint8: *out = load<uint8_t>(p); return true;
    case GgufType::kInt8: *out = load<int8_t>(p); return true;
    case GgufType::kUint16: *out = load<uint16_t>(p); return true;
    case GgufType::kInt16: *out = load<int16_t>(p); return true;
    case GgufType::kUint32: *out = load<uint32_t>(p); return true;
    case GgufType::kInt32: *out = load<int32_t>(p); return true;
    case GgufType::kInt64: *out = load<int64_t>(p); return true;
    case GgufType::kUint64: {
      uint64_t u = load<uint64_t>(p);
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
      *out = static_cast<int64_t>(u);
      return true;
    }
    default:
      return false;
  }
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

}  // namespace

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::kUint8: return "uint8";
    case GgufType::kInt8: return "int8";
    case GgufType::kUint16: return "uint16";
    case GgufType::kInt16: return "int16";
    case GgufType::kUint32: return "uint32";
    case GgufType::kInt32: return "int32";
    case GgufType::kFloat32: return "float32";
    case GgufType::kBool: return "bool";
    case GgufType::kString: return "string";
    case GgufType::kArray: return "array";
    case GgufType::kUint64: return "uint64";
    case GgufType::kInt64: return "int64";
    case GgufType::kFloat64: return "float64";
  }
  return "unknown";
}

uint32_t ggml_type_of(DType t) { return dtype_traits(t).ggml_type; }

uint64_t gguf_scalar_size(GgufType t) { return scalar_size_of(t); }

std::string_view ggml_type_name(uint32_t ggml_type) {
  // ggml's type ids in order (4 and 5 were removed formats; 31..33 and 36..38 were repacked
  // variants later dropped again).
  static constexpr std::string_view kNames[] = {
      "F32",     "F16",      "Q4_0",     "Q4_1",     "Q4_2",       "Q4_3",       "Q5_0",
      "Q5_1",    "Q8_0",     "Q8_1",     "Q2_K",     "Q3_K",       "Q4_K",       "Q5_K",
      "Q6_K",    "Q8_K",     "IQ2_XXS",  "IQ2_XS",   "IQ3_XXS",    "IQ1_S",      "IQ4_NL",
      "IQ3_S",   "IQ2_S",    "IQ4_XS",   "I8",       "I16",        "I32",        "I64",
      "F64",     "IQ1_M",    "BF16",     "Q4_0_4_4", "Q4_0_4_8",   "Q4_0_8_8",   "TQ1_0",
      "TQ2_0",   "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4"};
  if (ggml_type < std::size(kNames)) return kNames[ggml_type];
  return "unknown";
}

// Parses one mapped file into a GgufFile. Every read goes through take(), which checks the
// remaining bytes; error messages are built only on failure so the hot loops over vocabularies
// stay cheap.
class GgufParser {
 public:
  explicit GgufParser(std::shared_ptr<const MappedFile> file)
      : file_(std::move(file)), data_(file_->data()), size_(file_->size()) {}

  Result<std::unique_ptr<GgufFile>> parse();

 private:
  uint64_t remaining() const { return size_ - pos_; }
  bool take(uint64_t n, const uint8_t** p) {
    if (n > remaining()) return false;
    *p = data_ + pos_;
    pos_ += n;
    return true;
  }
  template <typename T>
  bool read(T* out) {
    const uint8_t* p;
    if (!take(sizeof(T), &p)) return false;
    *out = load<T>(p);
    return true;
  }

  Status truncated(const std::string& what) const {
    return data_loss(file_->path() + ": truncated: " + what + " ends past the end of the file (size " +
                     std::to_string(size_) + ")");
  }
  Status corrupt(const std::string& what) const { return data_loss(file_->path() + ": " + what); }

  // Reads a GGUF string (uint64 length + bytes) of at most max_len bytes. `what` is called
  // only to name the field in an error.
  template <typename What>
  Status read_string(std::string_view* out, uint64_t max_len, const What& what) {
    uint64_t len;
    if (!read(&len)) return truncated(what() + " length");
    if (len > max_len) {
      return corrupt(what() + " has length " + std::to_string(len) + ", more than the limit of " +
                     std::to_string(max_len));
    }
    const uint8_t* p;
    if (!take(len, &p)) return truncated(what());
    *out = std::string_view(reinterpret_cast<const char*>(p), len);
    return {};
  }

  // Not a template: it recurses into nested arrays with a new `what` each level.
  Status read_value(GgufType type, GgufValue* v, int depth, const std::function<std::string()>& what);
  Status parse_tensor_info(uint64_t index, GgufTensorInfo* info, uint64_t* nbytes);

  std::shared_ptr<const MappedFile> file_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

Status GgufParser::read_value(GgufType type, GgufValue* v, int depth,
                              const std::function<std::string()>& what) {
  v->type = type;
  const uint8_t* p;
  switch (type) {
    case GgufType::kString:
      return read_string(&v->s, kMaxStringLen, what);
    case GgufType::kArray: {
      uint32_t elem;
      uint64_t count;
      if (!read(&elem)) return truncated(what() + " array type");
      if (elem >= kNumGgufTypes) {
        return corrupt(what() + " is an array of invalid value type " + std::to_string(elem));
      }
      if (!read(&count)) return truncated(what() + " array length");
      v->elem_type = static_cast<GgufType>(elem);
      v->count = count;
      if (uint64_t size = scalar_size_of(v->elem_type); size != 0) {
        uint64_t bytes;
        if (!checked_mul(count, size, &bytes) || !take(bytes, &p)) {
          return truncated(what() + " (" + std::to_string(count) + " x " +
                           std::string(gguf_type_name(v->elem_type)) + ")");
        }
        v->raw = p;
        return {};
      }
      // Each string takes at least its 8-byte length, each nested array 12 bytes: reject counts
      // the file cannot hold before reserving anything.
      uint64_t min_elem = v->elem_type == GgufType::kString ? 8 : 12;
      if (count > remaining() / min_elem) {
        return truncated(what() + " (" + std::to_string(count) + " x " +
                         std::string(gguf_type_name(v->elem_type)) + ")");
      }
      if (v->elem_type == GgufType::kString) {
        // Grow as strings actually parse: memory stays proportional to real content.
        v->strings.reserve(std::min<uint64_t>(count, kMaxReserve));
        for (uint64_t k = 0; k < count; ++k) {
          std::string_view str;
          PAGODA_RETURN_IF_ERROR(read_string(&str, kMaxStringLen, [&] {
            return what() + " element " + std::to_string(k);
          }));
          v->strings.push_back(str);
        }
        return {};
      }
      if (depth >= kMaxArrayDepth) return corrupt(what() + " nests arrays too deeply");
      for (uint64_t k = 0; k < count; ++k) {  // validated, not exposed
        GgufValue inner;
        PAGODA_RETURN_IF_ERROR(read_value(GgufType::kArray, &inner, depth + 1, [&] {
          return what() + " element " + std::to_string(k);
        }));
      }
      return {};
    }
    default:
      break;
  }
  uint64_t size = scalar_size_of(type);
  if (!take(size, &p)) return truncated(what());
  switch (type) {
    case GgufType::kUint8: v->u = load<uint8_t>(p); break;
    case GgufType::kUint16: v->u = load<uint16_t>(p); break;
    case GgufType::kUint32: v->u = load<uint32_t>(p); break;
    case GgufType::kUint64: v->u = load<uint64_t>(p); break;
    case GgufType::kInt8: v->i = load<int8_t>(p); break;
    case GgufType::kInt16: v->i = load<int16_t>(p); break;
    case GgufType::kInt32: v->i = load<int32_t>(p); break;
    case GgufType::kInt64: v->i = load<int64_t>(p); break;
    case GgufType::kFloat32: v->f = load<float>(p); break;
    case GgufType::kFloat64: v->f = load<double>(p); break;
    case GgufType::kBool: v->b = load<uint8_t>(p) != 0; break;
    default: break;
  }
  if (is_integer_type(type)) {
    bool is_signed = type == GgufType::kInt8 || type == GgufType::kInt16 ||
                     type == GgufType::kInt32 || type == GgufType::kInt64;
    if (is_signed && v->i >= 0) v->u = static_cast<uint64_t>(v->i);
    if (!is_signed && v->u <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      v->i = static_cast<int64_t>(v->u);
    }
  }
  return {};
}

Status GgufParser::parse_tensor_info(uint64_t index, GgufTensorInfo* info, uint64_t* nbytes) {
  auto what = [&] { return "tensor info " + std::to_string(index); };
  std::string_view name;
  PAGODA_RETURN_IF_ERROR(read_string(&name, kMaxTensorNameLen, [&] { return what() + " name"; }));
  if (name.empty()) return corrupt(what() + " has an empty name");
  info->name = std::string(name);
  auto named = [&] { return "tensor " + info->name; };
  uint32_t n_dims;
  if (!read(&n_dims)) return truncated(named() + " n_dims");
  if (n_dims < 1 || n_dims > static_cast<uint32_t>(kMaxDims)) {
    return corrupt(named() + " has " + std::to_string(n_dims) + " dims (expected 1 to " +
                   std::to_string(kMaxDims) + ")");
  }
  uint64_t dims[kMaxDims];  // ggml order: dims[0] is the row length
  uint64_t numel = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    if (!read(&dims[d])) return truncated(named() + " dim " + std::to_string(d));
    if (dims[d] == 0 || dims[d] >= kMaxDim) {
      return corrupt(named() + " has invalid dim " + std::to_string(d) + " = " +
                     std::to_string(dims[d]));
    }
    if (!checked_mul(numel, dims[d], &numel) || numel >= kMaxDim) {
      return corrupt(named() + " has too many elements (dims overflow)");
    }
  }
  uint32_t ggml_type;
  if (!read(&ggml_type)) return truncated(named() + " type");
  std::optional<DType> dtype = dtype_from_ggml_type(ggml_type);
  if (!dtype) {
    return unimplemented(file_->path() + ": " + named() + " has unsupported type " +
                         std::string(ggml_type_name(ggml_type)) + " (" + std::to_string(ggml_type) +
                         ")");
  }
  if (dims[0] % static_cast<uint64_t>(block_elems(*dtype)) != 0) {
    return corrupt(named() + " has row length " + std::to_string(dims[0]) +
                   ", not a multiple of the " + std::string(dtype_name(*dtype)) + " block size " +
                   std::to_string(block_elems(*dtype)));
  }
  std::optional<uint64_t> bytes = dtype_bytes(*dtype, numel);
  if (!bytes) return corrupt(named() + " has a byte size that overflows");
  *nbytes = *bytes;
  if (!read(&info->offset)) return truncated(named() + " offset");
  info->tensor.dtype = *dtype;
  info->tensor.ndim = static_cast<int>(n_dims);
  for (uint32_t d = 0; d < n_dims; ++d) {
    info->tensor.shape[n_dims - 1 - d] = static_cast<int64_t>(dims[d]);
  }
  return {};
}

Result<std::unique_ptr<GgufFile>> GgufParser::parse() {
  std::unique_ptr<GgufFile> out(new GgufFile());
  out->file_ = file_;

  uint32_t magic, version;
  if (!read(&magic)) return truncated("magic");
  if (magic != kGgufMagic) return corrupt("not a GGUF file (bad magic " + hex32(magic) + ")");
  if (!read(&version)) return truncated("version");
  if (version == 1) return unimplemented(file_->path() + ": GGUF version 1 is not supported");
  if (version != 2 && version != 3) {
    if ((version & 0xffff) == 0 && (version >> 16) != 0) {
      return unimplemented(file_->path() + ": big-endian GGUF files are not supported");
    }
    return unimplemented(file_->path() + ": unsupported GGUF version " + std::to_string(version));
  }
  out->version_ = version;

  uint64_t n_tensors, n_kv;
  if (!read(&n_tensors)) return truncated("tensor count");
  if (!read(&n_kv)) return truncated("metadata count");
  if (n_kv > remaining() / kMinKvBytes) {
    return truncated("metadata (" + std::to_string(n_kv) + " entries)");
  }
  if (n_tensors > remaining() / kMinTensorInfoBytes) {
    return truncated("tensor infos (" + std::to_string(n_tensors) + " tensors)");
  }

  out->kv_.reserve(std::min(n_kv, kMaxReserve));
  std::unordered_set<std::string_view> keys;
  for (uint64_t k = 0; k < n_kv; ++k) {
    auto what = [&] { return "metadata key " + std::to_string(k); };
    std::string_view key;
    PAGODA_RETURN_IF_ERROR(read_string(&key, kMaxKeyLen, what));
    if (key.empty()) return corrupt(what() + " is empty");
    if (!keys.insert(key).second) return corrupt("duplicate metadata key " + std::string(key));
    auto named = [&] { return what() + " (" + std::string(key) + ")"; };
    uint32_t type;
    if (!read(&type)) return truncated(named() + " type");
    if (type >= kNumGgufTypes) {
      return corrupt(named() + " has invalid value type " + std::to_string(type));
    }
    GgufValue value;
    PAGODA_RETURN_IF_ERROR(read_value(static_cast<GgufType>(type), &value, 0, named));
    out->kv_.emplace_back(std::string(key), std::move(value));
  }

  if (const GgufValue* a = out->find("general.alignment")) {
    if (a->type != GgufType::kUint32) {
      return corrupt("general.alignment has type " + std::string(gguf_type_name(a->type)) +
                     ", expected uint32");
    }
    if (a->u == 0 || !std::has_single_bit(a->u)) {
      return corrupt("general.alignment " + std::to_string(a->u) + " is not a power of two");
    }
    out->alignment_ = a->u;
  }

  std::vector<uint64_t> nbytes;
  nbytes.reserve(std::min(n_tensors, kMaxReserve));
  out->tensors_.reserve(std::min(n_tensors, kMaxReserve));
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo info;
    uint64_t size = 0;
    PAGODA_RETURN_IF_ERROR(parse_tensor_info(t, &info, &size));
    if (!out->tensor_index_.emplace(info.name, t).second) {
      return corrupt("duplicate tensor name " + info.name);
    }
    out->tensors_.push_back(std::move(info));
    nbytes.push_back(size);
  }
  if (n_tensors == 0) return out;  // vocab-only files may end right here, unpadded

  uint64_t data_start;
  if (!checked_align_up(pos_, out->alignment_, &data_start)) return corrupt("data offset overflows");
  out->data_offset_ = data_start;
  for (uint64_t t = 0; t < n_tensors; ++t) {
    GgufTensorInfo& info = out->tensors_[t];
    if (info.offset % out->alignment_ != 0) {
      return corrupt("tensor " + info.name + " has offset " + std::to_string(info.offset) +
                     ", not a multiple of the alignment " + std::to_string(out->alignment_));
    }
    uint64_t begin, end;
    if (!checked_add(data_start, info.offset, &begin) || !checked_add(begin, nbytes[t], &end) ||
        end > size_) {
      return truncated("data of tensor " + info.name + " (offset " + std::to_string(info.offset) +
                       ", " + std::to_string(nbytes[t]) + " bytes)");
    }
    const uint8_t* p = data_ + begin;
    // Kernels read elements (and the fp16 scales of blocks) through typed pointers: copy the
    // rare tensor whose position in the mapping is misaligned for that.
    uint64_t need = info.tensor.dtype == DType::kF32 ? 4 : 2;
    if (reinterpret_cast<uintptr_t>(p) % need != 0) {
      auto copy = std::make_shared<Buffer>(nbytes[t]);
      std::memcpy(copy->data(), p, nbytes[t]);
      info.tensor.data = copy->data();
      out->copies_.push_back(std::move(copy));
    } else {
      info.tensor.data = const_cast<uint8_t*>(p);
    }
  }
  return out;
}

Result<std::unique_ptr<GgufFile>> GgufFile::open(const std::string& path) {
  PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::open(path));
  GgufParser parser(std::shared_ptr<const MappedFile>(std::move(file)));
  try {
    return parser.parse();
  } catch (const std::bad_alloc&) {  // a huge (but well-formed) vocabulary or tensor list
    return resource_exhausted(path + ": out of memory while reading the GGUF metadata");
  }
}

const std::string& GgufFile::path() const { return file_->path(); }

const GgufValue* GgufFile::find(std::string_view key) const {
  for (const auto& [k, v] : kv_) {
    if (k == key) return &v;
  }
  return nullptr;
}

const GgufTensorInfo* GgufFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

Status GgufFile::type_error(std::string_view key, const GgufValue& v, const char* expected) const {
  std::string has(gguf_type_name(v.type));
  if (v.type == GgufType::kArray) has += " of " + std::string(gguf_type_name(v.elem_type));
  return data_loss(path() + ": metadata key " + std::string(key) + " has type " + has +
                   ", expected " + expected);
}

namespace {
Status missing_key(const std::string& path, std::string_view key) {
  return not_found(path + ": missing metadata key " + std::string(key));
}
// The array getters copy out count elements (up to 8 bytes per byte of the file for a uint8
// array read as int64): a bad_alloc there becomes a Status, never an escaping exception.
Status array_too_big(const std::string& path, std::string_view key, uint64_t count) {
  return resource_exhausted(path + ": out of memory copying metadata array " + std::string(key) +
                            " (" + std::to_string(count) + " elements)");
}
}  // namespace

Result<std::string> GgufFile::get_string(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path(), key);
  if (v->type != GgufType::kString) return type_error(key, *v, "string");
  return std::string(v->s);
}

Result<int64_t> GgufFile::get_int(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path(), key);
  if (!is_integer_type(v->type)) return type_error(key, *v, "an integer");
  if (v->type == GgufType::kUint64 &&
      v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return data_loss(path() + ": metadata key " + std::string(key) + " value " +
                     std::to_string(v->u) + " is out of range");
  }
  return v->i;
}

Result<double> GgufFile::get_float(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path(), key);
  if (is_float_type(v->type)) return v->f;
  if (is_integer_type(v->type)) {
    return v->type == GgufType::kUint64 ? static_cast<double>(v->u) : static_cast<double>(v->i);
  }
  return type_error(key, *v, "a number");
}

Result<bool> GgufFile::get_bool(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path(), key);
  if (v->type != GgufType::kBool) return type_error(key, *v, "bool");
  return v->b;
}

Result<std::vector<std::string_view>> GgufFile::get_string_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path(), key);
  if (v->type != GgufType::kArray || v->elem_type != GgufType::kString) {
    return type_error(key, *v, "array of string");
  }
  try {
    return v->strings;
  } catch (const std::bad_alloc&) {
    return array_too_big(path(), key, v->count);
  }
}

Result<std::vector<float>> GgufFile::get_float_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path(), key);
  if (v->type != GgufType::kArray || scalar_size_of(v->elem_type) == 0 ||
      v->elem_type == GgufType::kBool) {
    return type_error(key, *v, "array of numbers");
  }
  std::vector<float> out;
  try {
    out.resize(v->count);
  } catch (const std::bad_alloc&) {
    return array_too_big(path(), key, v->count);
  }
  uint64_t size = scalar_size_of(v->elem_type);
  for (uint64_t k = 0; k < v->count; ++k) {
    const uint8_t* p = v->raw + k * size;
    switch (v->elem_type) {
      case GgufType::kFloat32: out[k] = load<float>(p); break;
      case GgufType::kFloat64: out[k] = static_cast<float>(load<double>(p)); break;
      case GgufType::kUint64: out[k] = static_cast<float>(load<uint64_t>(p)); break;
      default: {
        int64_t i = 0;
        load_int(v->elem_type, p, &i);
        out[k] = static_cast<float>(i);
      }
    }
  }
  return out;
}

Result<std::vector<int64_t>> GgufFile::get_int_array(std::string_view key) const {
  const GgufValue* v = find(key);
  if (!v) return missing_key(path(), key);
  if (v->type != GgufType::kArray || !is_integer_type(v->elem_type)) {
    return type_error(key, *v, "array of integers");
  }
  std::vector<int64_t> out;
  try {
    out.resize(v->count);
  } catch (const std::bad_alloc&) {
    return array_too_big(path(), key, v->count);
  }
  uint64_t size = scalar_size_of(v->elem_type);
  for (uint64_t k = 0; k < v->count; ++k) {
    if (!load_int(v->elem_type, v->raw + k * size, &out[k])) {
      return data_loss(path() + ": metadata key " + std::string(key) + " element " +
                       std::to_string(k) + " is out of range");
    }
  }
  return out;
}

}  // namespace pagoda
