#include "model/layers/weight_loader.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/log.h"
#include "model/quant/quant_method.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

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
  if (!mix_) return t;
  // Under an int-codes mix what is not a layer projection stays as stored (linear() takes those).
  if (is_quantized(t.dtype) || mix_->rule == QuantMixRule::kIntCodes) {
    ++converted_types_[t.dtype];
    return t;
  }
  const WeightSlot slot{slot_name, cfg_.num_layers, cfg_.num_heads / std::max<int64_t>(1, cfg_.num_kv_heads)};
  const DType to = quant_mix_type(*mix_, slot, t.row_len());
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

Result<Linear> WeightLoader::linear(const std::string& name, int64_t rows, int64_t cols, const std::string& slot_name,
                                   Slice slice) {
  const LinearRequest request{name, rows, cols, slot_name, slice};
  PAGODA_ASSIGN_OR_RETURN(Linear l, quant_method_for(*this, request).create_weights(*this, request));
  l.set_name(name);
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
  if (mix_ || !int_types_.empty()) {
    std::string types;
    for (const auto& [t, count] : converted_types_) {
      if (count > 0) types += (types.empty() ? "" : ", ") + std::to_string(count) + " " + std::string(dtype_name(t));
    }
    for (const auto& [name, count] : int_types_) types += (types.empty() ? "" : ", ") + std::to_string(count) + " " + name;
    log_line(LogLevel::kInfo, "model",
             "weights typed by " + (mix_ ? mix_->name : std::string("the checkpoint")) +
                 " at load (float ones converted, quantized ones as stored): " + types);
  }
}

}  // namespace pagoda
