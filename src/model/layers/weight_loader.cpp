#include "model/layers/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/log.h"
#include "loader/packed_linear.h"
#include "loader/quant_mix.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

// The most columns one integer scale may cover (Kernels::matmul_int's exact int32 bracket).
constexpr int64_t kMaxIntGroup = 65536;

}  // namespace

Result<Tensor> WeightLoader::matrix(const std::string& name, int64_t rows, int64_t cols) {
  PAGODA_ASSIGN_OR_RETURN(Tensor t, source_.weights.get(name, {rows, cols}));
  if (!backend_.supports_weight_type(t.dtype)) {
    return unimplemented(source_.path + ": backend " + backend_.name() +
                         " cannot compute on tensor " + name + " of type " +
                         std::string(dtype_name(t.dtype)));
  }
  return t;
}

Result<Tensor> WeightLoader::matrix_rows(const std::string& name, int64_t rows, int64_t cols, IndexRange part) {
  PAGODA_ASSIGN_OR_RETURN(Tensor t, matrix(name, rows, cols));
  Buffer unused;
  return slice_dense(t, Slice::rows(part), &unused, slice_context(name));
}

std::string WeightLoader::slice_context(const std::string& name) const {
  return source_.path + ": tensor " + name + " (tensor-parallel rank " + std::to_string(plan_.tp.rank) + " of " +
         std::to_string(plan_.tp.size) + ")";
}

Result<Tensor> slice_dense(const Tensor& t, const Slice& slice, Buffer* storage, const std::string& context) {
  const IndexRange r = slice.range;
  if (slice.dim == Slice::Dim::kWhole) return t;
  // Every column (no tensor parallelism): the tensor itself, not a copy of it.
  if (slice.dim == Slice::Dim::kCols && r.begin == 0 && r.end == t.row_len()) return t;
  if (slice.dim == Slice::Dim::kRows) {  // whole rows: a view
    PAGODA_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= t.num_rows());
    Tensor view(const_cast<uint8_t*>(t.row(r.begin)), t.dtype, {r.size(), t.row_len()});
    return view;
  }
  PAGODA_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= t.row_len());
  const int64_t block = block_elems(t.dtype);
  if (r.begin % block != 0 || r.end % block != 0) {
    return invalid_argument(context + " is " + std::string(dtype_name(t.dtype)) + " in blocks of " +
                            std::to_string(block) + " columns, and its columns [" + std::to_string(r.begin) + ", " +
                            std::to_string(r.end) + ") cut a block; choose another --tensor-parallel-size");
  }
  Tensor out(nullptr, t.dtype, {t.num_rows(), r.size()});
  *storage = Buffer(static_cast<size_t>(out.nbytes()));
  out.data = storage->data();
  const int64_t offset = r.begin / block * block_bytes(t.dtype);
  for (int64_t row = 0; row < t.num_rows(); ++row) {
    std::memcpy(storage->as<uint8_t>() + row * out.row_bytes(), t.row(row) + offset, static_cast<size_t>(out.row_bytes()));
  }
  return out;
}

Result<IntCodes> slice_int_codes(IntCodes c, const Slice& slice, const std::string& context) {
  const IndexRange r = slice.range;
  if (slice.dim == Slice::Dim::kWhole) return c;
  if (slice.dim == Slice::Dim::kCols && r.begin == 0 && r.end == c.k) return c;  // every column
  if (c.group_size <= 0) c.group_size = c.k;  // one scale per output channel
  const int64_t groups = c.groups();
  const int64_t row_bytes = c.bits == 8 ? c.k : c.k / 2;
  if (slice.dim == Slice::Dim::kRows) {
    PAGODA_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= c.n);
    IntCodes out = c;
    out.n = r.size();
    out.codes.assign(c.codes.begin() + r.begin * row_bytes, c.codes.begin() + r.end * row_bytes);
    out.scales.assign(c.scales.begin() + r.begin * groups, c.scales.begin() + r.end * groups);
    if (!c.zero_points.empty()) {
      out.zero_points.assign(c.zero_points.begin() + r.begin * groups, c.zero_points.begin() + r.end * groups);
    }
    return out;
  }
  // Columns: the code columns whose input column falls in the range (all of a group or none of
  // it, unless one scale covers the row), in their order.
  PAGODA_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= c.k);
  const bool per_channel = c.group_size == c.k;
  auto input_of = [&c](int64_t t) { return c.perm.empty() ? t : int64_t{c.perm[static_cast<size_t>(t)]}; };
  std::vector<int64_t> kept;
  std::vector<int64_t> kept_groups;
  for (int64_t g = 0; g < groups; ++g) {
    int64_t in = 0;
    for (int64_t t = g * c.group_size; t < (g + 1) * c.group_size; ++t) {
      const int64_t col = input_of(t);
      if (col >= r.begin && col < r.end) {
        kept.push_back(t);
        ++in;
      }
    }
    if (in > 0 && in != c.group_size && !per_channel) {
      return invalid_argument(context + " has scales in groups of " + std::to_string(c.group_size) +
                              " columns, and its columns [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                              ") take part of group " + std::to_string(g) + "; choose another --tensor-parallel-size");
    }
    if (in > 0) kept_groups.push_back(g);
  }
  const int64_t k = static_cast<int64_t>(kept.size());
  if (c.bits == 4 && k % 2 != 0) {
    return invalid_argument(context + ": its columns [" + std::to_string(r.begin) + ", " + std::to_string(r.end) +
                            ") hold an odd number of int4 codes (" + std::to_string(k) +
                            "); choose another --tensor-parallel-size");
  }
  IntCodes out = c;
  out.k = k;
  out.group_size = per_channel ? k : c.group_size;
  const int64_t out_row_bytes = c.bits == 8 ? k : k / 2;
  out.codes.assign(static_cast<size_t>(c.n * out_row_bytes), 0);
  for (int64_t row = 0; row < c.n; ++row) {
    const uint8_t* in = c.codes.data() + row * row_bytes;
    uint8_t* o = out.codes.data() + row * out_row_bytes;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t t = kept[static_cast<size_t>(j)];
      if (c.bits == 8) {
        o[j] = in[t];
      } else {
        const uint8_t nibble = (in[t / 2] >> (4 * (t % 2))) & 0xF;
        o[j / 2] = static_cast<uint8_t>(o[j / 2] | (nibble << (4 * (j % 2))));
      }
    }
  }
  const int64_t out_groups = out.groups();
  if (!per_channel) {
    out.scales.assign(static_cast<size_t>(c.n * out_groups), 0);
    if (!c.zero_points.empty()) out.zero_points.assign(static_cast<size_t>(c.n * out_groups), 0);
    for (int64_t row = 0; row < c.n; ++row) {
      for (int64_t j = 0; j < out_groups; ++j) {
        const int64_t g = kept_groups[static_cast<size_t>(j)];
        out.scales[static_cast<size_t>(row * out_groups + j)] = c.scales[static_cast<size_t>(row * groups + g)];
        if (!c.zero_points.empty()) {
          out.zero_points[static_cast<size_t>(row * out_groups + j)] =
              c.zero_points[static_cast<size_t>(row * groups + g)];
        }
      }
    }
  }
  if (!c.perm.empty()) {
    for (int64_t j = 0; j < k; ++j) {
      out.perm[static_cast<size_t>(j)] = static_cast<int32_t>(input_of(kept[static_cast<size_t>(j)]) - r.begin);
    }
    out.perm.resize(static_cast<size_t>(k));
  }
  return out;
}

Result<Tensor> WeightLoader::convert(const std::string& name, const std::string& slot_name, Tensor t,
                                   Buffer* storage) {
  if (!source_.weight_mix) return t;
  // Under an int-codes mix what is not a layer projection stays as stored (linear() takes those).
  if (is_quantized(t.dtype) || source_.weight_mix->rule == QuantMixRule::kIntCodes) {
    ++converted_types_[t.dtype];
    return t;
  }
  const WeightSlot slot{slot_name, cfg_.num_layers, cfg_.num_heads / std::max<int64_t>(1, cfg_.num_kv_heads)};
  const DType to = quant_mix_type(*source_.weight_mix, slot, t.row_len());
  ++converted_types_[to];
  if (to == t.dtype) return t;
  if (!backend_.supports_weight_type(to)) {
    return unimplemented(source_.path + ": backend " + backend_.name() + " cannot compute on tensor " + name +
                         " converted to " + std::string(dtype_name(to)));
  }
  Tensor out(nullptr, to, {t.num_rows(), t.row_len()});
  *storage = Buffer(static_cast<size_t>(out.nbytes()));
  out.data = storage->data();
  std::vector<float> row(static_cast<size_t>(t.row_len()));
  for (int64_t r = 0; r < t.num_rows(); ++r) {
    dequantize_row(t.dtype, t.row(r), row.data(), t.row_len());
    quantize_row(to, row.data(), storage->as<uint8_t>() + r * out.row_bytes(), t.row_len());
  }
  return out;
}

Result<IntCodes> WeightLoader::int8_codes(const std::string& name, const Tensor& codes) {
  // The scales beside the codes (compressed-tensors names: "<weight>_scale", "<...>.input_scale").
  const std::string base = name.substr(0, name.size() - 6);  // without "weight"
  const std::string scale_name = base + "weight_scale", input_name = base + "input_scale";
  const Tensor* scale = source_.weights.find(scale_name);
  if (scale == nullptr) {
    return data_loss(source_.path + ": tensor " + name + " holds int8 codes but " + scale_name + " is missing");
  }
  const int64_t rows = codes.num_rows(), cols = codes.row_len();
  if (cols > kMaxIntGroup) {  // per channel: one group of the whole row (kernels.h's int32 bound)
    return unimplemented(source_.path + ": tensor " + name + " has rows of " + std::to_string(cols) +
                         " int8 codes; at most " + std::to_string(kMaxIntGroup) + " per scale are supported");
  }
  const int bits = cfg_.quantization.bits == 4 ? 4 : 8;
  const int64_t group = cfg_.quantization.group_size > 0 ? cfg_.quantization.group_size : cols;
  const int64_t groups = cols % group == 0 ? cols / group : 0;
  const bool per_channel = scale->numel() == rows && (scale->ndim == 1 || (scale->ndim == 2 && scale->dim(1) == 1));
  const bool per_tensor = scale->numel() == 1 && bits == 8;
  const bool per_group = groups > 1 && scale->ndim == 2 && scale->dim(0) == rows && scale->dim(1) == groups;
  if (!(per_channel || per_tensor || per_group) || !dtype_traits(scale->dtype).dense_matmul || is_quantized(scale->dtype)) {
    const std::string want = groups > 1 ? "per group [" + std::to_string(rows) + ", " + std::to_string(groups) + "]"
                                        : "per output channel [" + std::to_string(rows) + ", 1]" +
                                              (bits == 8 ? " or per tensor [1]" : "");
    return data_loss(source_.path + ": tensor " + scale_name + " " + scale->shape_string() + " " +
                     std::string(dtype_name(scale->dtype)) + " is not a float scale " + want + " of " + name + " " +
                     codes.shape_string());
  }
  std::vector<float> values(static_cast<size_t>(scale->numel()));
  dequantize_row(scale->dtype, scale->data, values.data(), scale->numel());
  if (per_tensor) values.assign(static_cast<size_t>(rows), values[0]);
  for (float v : values) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return data_loss(source_.path + ": tensor " + scale_name + " has a scale that is negative or not finite");
    }
  }
  float input_scale = 0;
  if (const Tensor* in = source_.weights.find(input_name)) {
    if (in->numel() != 1 || !dtype_traits(in->dtype).dense_matmul || is_quantized(in->dtype)) {
      return data_loss(source_.path + ": tensor " + input_name + " " + in->shape_string() + " is not one float scale");
    }
    dequantize_row(in->dtype, in->data, &input_scale, 1);
    if (!(input_scale > 0) || !std::isfinite(input_scale)) {
      return data_loss(source_.path + ": tensor " + input_name + " is not a positive finite scale");
    }
  } else if (cfg_.quantization.static_input_scales) {
    return data_loss(source_.path + ": the checkpoint declares static activation scales but " + input_name +
                     " is missing");
  }
  // The codes one per byte, as compressed-tensors' int-quantized format stores them (int4 ones
  // too): copied, the int4 ones two per byte for the int4 kernel.
  if (bits == 4 && (cols % 2 != 0 || (group != cols && group % 8 != 0))) {
    return data_loss(source_.path + ": tensor " + name + " " + codes.shape_string() + " has rows that are not whole " +
                     "int4 pairs and groups of " + std::to_string(group));
  }
  IntCodes c;
  c.bits = bits;
  c.n = rows;
  c.k = cols;
  c.group_size = per_group ? group : cols;
  c.method = bits == 4 ? "w4a8" : "w8a8";
  c.input_scale = input_scale;
  c.scales = std::move(values);
  const int64_t row_bytes = bits == 8 ? cols : cols / 2;
  c.codes.assign(static_cast<size_t>(rows * row_bytes), 0);
  for (int64_t j = 0; j < rows; ++j) {
    const auto* in = static_cast<const int8_t*>(codes.data) + j * cols;
    uint8_t* out = c.codes.data() + j * row_bytes;
    for (int64_t t = 0; t < cols; ++t) {
      if (bits == 8) {
        out[t] = static_cast<uint8_t>(in[t]);
      } else if (in[t] < -8 || in[t] > 7) {
        return data_loss(source_.path + ": tensor " + name + " holds " + std::to_string(in[t]) +
                         ", outside the 4-bit range [-8, 7] (row " + std::to_string(j) + ")");
      } else {
        out[t / 2] |= static_cast<uint8_t>((in[t] & 0xF) << (4 * (t % 2)));
      }
    }
  }
  return c;
}

Result<Linear> WeightLoader::linear(const std::string& name, int64_t rows, int64_t cols, const std::string& slot_name,
                                   Slice slice) {
  auto from_codes = [&](IntCodes codes) -> Result<Linear> {
    PAGODA_ASSIGN_OR_RETURN(codes, slice_int_codes(std::move(codes), slice, slice_context(name)));
    Linear l = Linear::int_codes(k_, std::move(codes));
    ++int_types_[l.type_name() + " (checkpoint)"];
    l.set_name(name);
    return l;
  };
  if (source_.weights.find(name) == nullptr && has_packed_linear(source_.weights, name, cfg_.quantization)) {
    PAGODA_ASSIGN_OR_RETURN(IntCodes codes, read_packed_linear(source_.weights, name, rows, cols, cfg_.quantization));
    return from_codes(std::move(codes));
  }
  if (const Tensor* stored = source_.weights.find(name); stored != nullptr && stored->dtype == DType::kI8) {
    PAGODA_ASSIGN_OR_RETURN(Tensor codes, source_.weights.get(name, {rows, cols}));
    PAGODA_ASSIGN_OR_RETURN(IntCodes c, int8_codes(name, codes));
    return from_codes(std::move(c));
  }
  PAGODA_ASSIGN_OR_RETURN(Tensor whole, matrix(name, rows, cols));
  Buffer sliced;
  PAGODA_ASSIGN_OR_RETURN(Tensor t, slice_dense(whole, slice, &sliced, slice_context(name)));
  // Whether the Linear ends up reading the stored tensor's memory (then the map keeps it).
  auto reads_stored = [&whole](const Linear& l) {
    const auto* p = static_cast<const uint8_t*>(l.dense_weight().data);
    const auto* begin = static_cast<const uint8_t*>(whole.data);
    return p >= begin && p < begin + whole.nbytes();
  };
  const std::string& slot = slot_name.empty() ? name : slot_name;
  const int64_t in = t.row_len();
  if (source_.weight_mix && quant_mix_int_codes(*source_.weight_mix, WeightSlot{slot}) && !is_quantized(t.dtype)) {
    int bits = source_.weight_mix->int_bits;
    const int64_t group = quant_mix_int_group(*source_.weight_mix, in);
    if (bits == 4 && in % 2 != 0) bits = 8;  // no whole int4 pairs: int8 per channel
    if ((bits == 8 || group == in) && in > kMaxIntGroup) {
      return unimplemented(source_.path + ": tensor " + name + " has rows of " + std::to_string(in) + " values; " +
                           source_.weight_mix->name + " takes at most " + std::to_string(kMaxIntGroup) + " per scale");
    }
    Linear l = Linear::quantize_int(k_, t, bits, bits == 8 && group != in ? in : group);
    ++int_types_[l.type_name()];
    l.set_name(name);
    source_.weights.release(name);  // the codes are a copy
    return l;
  }
  Buffer converted;
  PAGODA_ASSIGN_OR_RETURN(Tensor typed, convert(name, slot, t, &converted));
  // The Linear keeps the memory its weight points into: the conversion, else the column slice.
  Linear l = Linear::dense(k_, typed, typed.data == t.data ? std::move(sliced) : std::move(converted));
  l.set_name(name);
  if (!reads_stored(l)) source_.weights.release(name);  // packed, converted or sliced: a copy
  return l;
}

Result<F32Vector> WeightLoader::vector(const std::string& name, int64_t len) {
  return vector(name, len, IndexRange{0, len});
}

Result<F32Vector> WeightLoader::vector(const std::string& name, int64_t len, IndexRange part) {
  PAGODA_ASSIGN_OR_RETURN(Tensor t, source_.weights.get(name, {len}));
  PAGODA_CHECK(part.begin >= 0 && part.begin <= part.end && part.end <= len);
  std::vector<float> all(static_cast<size_t>(len));
  dequantize_row(t.dtype, t.data, all.data(), len);
  const size_t bytes = static_cast<size_t>(part.size()) * sizeof(float);
  F32Vector v{k_.allocate(bytes)};  // the device's memory
  if (bytes > 0) k_.copy_to_device(v.data.data(), all.data() + part.begin, bytes);
  return v;
}

void WeightLoader::log_types() const {
  if (source_.weight_mix || !int_types_.empty()) {
    std::string types;
    for (const auto& [t, count] : converted_types_) {
      if (count > 0) types += (types.empty() ? "" : ", ") + std::to_string(count) + " " + std::string(dtype_name(t));
    }
    for (const auto& [name, count] : int_types_) types += (types.empty() ? "" : ", ") + std::to_string(count) + " " + name;
    log_line(LogLevel::kInfo, "model",
             "weights typed by " + (source_.weight_mix ? source_.weight_mix->name : std::string("the checkpoint")) +
                 " at load (float ones converted, quantized ones as stored): " + types);
  }
}

}  // namespace pagoda
