#include "model/quant/packed_linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "loader/packed_names.h"
#include "tensor/convert.h"
#include "tensor/dtype.h"

namespace pagoda {
namespace {

bool is_compressed(const CheckpointQuantization& q) { return q.method == "compressed-tensors"; }

std::string shape_of(std::initializer_list<int64_t> shape) {
  std::string s = "[";
  for (int64_t d : shape) s += (s.size() > 1 ? ", " : "") + std::to_string(d);
  return s + "]";
}

// Element i of an I32 tensor (little-endian; any alignment).
uint32_t word(const Tensor& t, int64_t i) {
  uint32_t w;
  std::memcpy(&w, static_cast<const uint8_t*>(t.data) + 4 * i, 4);
  return w;
}

class Reader {
 public:
  Reader(const WeightMap& weights, const std::string& weight_name, const CheckpointQuantization& q)
      : weights_(weights), weight_(weight_name), q_(q) {}

  std::string name(const char* suffix) const { return companion_name(weight_, suffix); }

  Status fail(const std::string& tensor, const std::string& problem) const {
    return data_loss(weights_.source() + ": tensor " + tensor + " (" + q_.method + " projection " + weight_ + ") " +
                     problem);
  }

  // The tensor `suffix`, of one of the types `allowed` and this shape.
  Result<Tensor> get(const char* suffix, std::initializer_list<DType> allowed, std::initializer_list<int64_t> shape) const {
    const std::string n = name(suffix);
    const Tensor* t = weights_.find(n);
    if (t == nullptr) return data_loss(weights_.source() + ": tensor " + n + " is missing (" + q_.method + " projection " + weight_ + ")");
    if (std::find(allowed.begin(), allowed.end(), t->dtype) == allowed.end()) {
      std::string names;
      for (DType d : allowed) names += (names.empty() ? "" : " or ") + std::string(dtype_name(d));
      return fail(n, "has type " + std::string(dtype_name(t->dtype)) + ", expected " + names);
    }
    const bool same = t->ndim == static_cast<int>(shape.size()) && std::equal(shape.begin(), shape.end(), t->shape.begin());
    if (!same) return fail(n, "has shape " + t->shape_string() + ", expected " + shape_of(shape));
    return *t;
  }

  const Tensor* find(const char* suffix) const { return weights_.find(name(suffix)); }

 private:
  const WeightMap& weights_;
  const std::string& weight_;
  const CheckpointQuantization& q_;
};

constexpr std::initializer_list<DType> kFloatTypes = {DType::kF16, DType::kBF16, DType::kF32};

}  // namespace

Result<IntCodes> read_packed_linear(const WeightMap& weights, const std::string& weight_name, int64_t n, int64_t k,
                                    const CheckpointQuantization& q) {
  const Reader r(weights, weight_name, q);
  const PackedNames& names = packed_names(q);
  const int b = q.bits;
  if (b != 4 && b != 8) return r.fail(r.name(names.codes), "has " + std::to_string(b) + "-bit codes (supported: 4, 8)");
  const int64_t per_word = 32 / b, half = int64_t{1} << (b - 1);
  const uint32_t mask = (1u << b) - 1;
  const int64_t g_size = q.group_size > 0 ? q.group_size : k;
  if (k % g_size != 0 || k % 8 != 0) {
    return r.fail(r.name(names.codes), "has " + std::to_string(k) + " input columns, not a multiple of 8 and of the group size " +
                                           std::to_string(g_size));
  }
  const int64_t groups = k / g_size;

  // The kernels' exact int32 bracket, sum over a group of (code - zero) * x with |x| <= 127,
  // needs group * 256 * 127 < 2^31 (|code - zero| <= 256: a GPTQ v1 8-bit zero of 128 against
  // the code -128).
  if (g_size > 65536) {
    return r.fail(r.name(names.codes), "has groups of " + std::to_string(g_size) + " inputs (at most 65536 are supported)");
  }
  // u(j, t): the unsigned code; z(j, g): the unsigned zero point; scale(j, g); group(t). Sized
  // once the packed tensors' shapes have been checked against [n, k] (alloc below), so a config
  // that disagrees with the file fails with an error, not an allocation of its size.
  std::vector<uint8_t> u;
  std::vector<int32_t> z;
  std::vector<float> scales;
  auto alloc = [&] {
    u.assign(static_cast<size_t>(n * k), 0);
    z.assign(static_cast<size_t>(n * groups), static_cast<int32_t>(half));
    scales.assign(static_cast<size_t>(n * groups), 0.0f);
  };
  Tensor scale_tensor;
  bool scales_by_group_first = true;  // AWQ / GPTQ: [groups, n]; compressed-tensors: [n, groups]
  if (q.method == "awq") {
    // qweight [k, n / 8]: word (t, p) holds outputs 8p..8p+7, output 8p + c in slot kRev[c].
    if (b != 4) return r.fail(r.name(names.codes), "holds " + std::to_string(b) + "-bit codes; AWQ's GEMM packing is 4-bit");
    if (n % 8 != 0) return r.fail(r.name(names.codes), "packs " + std::to_string(n) + " outputs, not a multiple of 8");
    static constexpr int kRev[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    PAGODA_ASSIGN_OR_RETURN(Tensor qw, r.get(names.codes, {DType::kI32}, {k, n / 8}));
    PAGODA_ASSIGN_OR_RETURN(Tensor qz, r.get(names.zeros, {DType::kI32}, {groups, n / 8}));
    PAGODA_ASSIGN_OR_RETURN(scale_tensor, r.get(names.scales, kFloatTypes, {groups, n}));
    alloc();
    for (int64_t t = 0; t < k; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        u[static_cast<size_t>(j * k + t)] = static_cast<uint8_t>((word(qw, t * (n / 8) + j / 8) >> (4 * kRev[j % 8])) & 15);
      }
    }
    for (int64_t g = 0; g < groups; ++g) {
      for (int64_t j = 0; j < n; ++j) {
        z[static_cast<size_t>(j * groups + g)] = static_cast<int32_t>((word(qz, g * (n / 8) + j / 8) >> (4 * kRev[j % 8])) & 15);
      }
    }
  } else if (q.method == "gptq") {
    // qweight [k / P, n]: slot s of word (r, j) is input r * P + s; qzeros [groups, n / P]: slot s
    // of word (g, c) is output c * P + s; v1 stores each zero minus one.
    if (n % per_word != 0) return r.fail(r.name(names.zeros), "packs " + std::to_string(n) + " outputs, not a multiple of " + std::to_string(per_word));
    PAGODA_ASSIGN_OR_RETURN(Tensor qw, r.get(names.codes, {DType::kI32}, {k / per_word, n}));
    PAGODA_ASSIGN_OR_RETURN(scale_tensor, r.get(names.scales, kFloatTypes, {groups, n}));
    alloc();
    for (int64_t t = 0; t < k; ++t) {
      for (int64_t j = 0; j < n; ++j) {
        u[static_cast<size_t>(j * k + t)] = static_cast<uint8_t>((word(qw, (t / per_word) * n + j) >> (b * (t % per_word))) & mask);
      }
    }
    if (r.find(names.zeros) != nullptr || !q.symmetric) {
      PAGODA_ASSIGN_OR_RETURN(Tensor qz, r.get(names.zeros, {DType::kI32}, {groups, n / per_word}));
      for (int64_t g = 0; g < groups; ++g) {
        for (int64_t j = 0; j < n; ++j) {
          const uint32_t stored = (word(qz, g * (n / per_word) + j / per_word) >> (b * (j % per_word))) & mask;
          z[static_cast<size_t>(j * groups + g)] = static_cast<int32_t>(stored) + (q.zeros_minus_one ? 1 : 0);
        }
      }
    }
  } else if (is_compressed(q) && q.format == "pack-quantized") {
    // weight_packed [n, k / P]: slot s of word (j, w) is input w * P + s, stored as code + half.
    PAGODA_ASSIGN_OR_RETURN(Tensor qw, r.get(names.codes, {DType::kI32}, {n, k / per_word}));
    if (const Tensor* shape = r.find("weight_shape")) {
      if (shape->numel() != 2 || (shape->dtype != DType::kI64 && shape->dtype != DType::kI32)) {
        return r.fail(r.name("weight_shape"), "is not two integers");
      }
      // Read as the integers they are: a float round trip would turn a huge stored dimension
      // into a value that cannot be converted back for the message.
      int64_t dims[2];
      for (int i = 0; i < 2; ++i) {
        if (shape->dtype == DType::kI64) {
          std::memcpy(&dims[i], static_cast<const uint8_t*>(shape->data) + 8 * i, 8);
        } else {
          int32_t d;
          std::memcpy(&d, static_cast<const uint8_t*>(shape->data) + 4 * i, 4);
          dims[i] = d;
        }
      }
      if (dims[0] != n || dims[1] != k) {
        return r.fail(r.name("weight_shape"), "says [" + std::to_string(dims[0]) + ", " + std::to_string(dims[1]) +
                                                  "], expected " + shape_of({n, k}));
      }
    }
    PAGODA_ASSIGN_OR_RETURN(scale_tensor, r.get(names.scales, kFloatTypes, {n, groups}));
    scales_by_group_first = false;
    alloc();
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t t = 0; t < k; ++t) {
        u[static_cast<size_t>(j * k + t)] = static_cast<uint8_t>((word(qw, j * (k / per_word) + t / per_word) >> (b * (t % per_word))) & mask);
      }
    }
    if (!q.symmetric) {
      // weight_zero_point: the signed zero per (output, group), either packed along the outputs
      // with the codes' offset ([ceil(n / P), groups] int32) or as it is, one int8 each ([n, groups]).
      const Tensor* zp = r.find(names.zeros);
      if (zp != nullptr && zp->dtype == DType::kI8) {
        PAGODA_ASSIGN_OR_RETURN(Tensor zt, r.get(names.zeros, {DType::kI8}, {n, groups}));
        for (int64_t i = 0; i < n * groups; ++i) z[static_cast<size_t>(i)] = static_cast<const int8_t*>(zt.data)[i] + static_cast<int32_t>(half);
      } else {
        const int64_t rows = (n + per_word - 1) / per_word;
        PAGODA_ASSIGN_OR_RETURN(Tensor zt, r.get(names.zeros, {DType::kI32}, {rows, groups}));
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t g = 0; g < groups; ++g) {
            z[static_cast<size_t>(j * groups + g)] = static_cast<int32_t>((word(zt, (j / per_word) * groups + g) >> (b * (j % per_word))) & mask);
          }
        }
      }
    }
  } else {
    return r.fail(weight_name, "is not in a packed format Pagoda reads (method " + q.method + ", format " + q.format + ")");
  }

  // Scales, as f32, by (output, group).
  {
    std::vector<float> raw(static_cast<size_t>(n * groups));
    dequantize_row(scale_tensor.dtype, scale_tensor.data, raw.data(), n * groups);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t g = 0; g < groups; ++g) {
        const float s = scales_by_group_first ? raw[static_cast<size_t>(g * n + j)] : raw[static_cast<size_t>(j * groups + g)];
        if (!std::isfinite(s)) return r.fail(r.name(names.scales), "has a scale that is not finite (output " + std::to_string(j) + ")");
        scales[static_cast<size_t>(j * groups + g)] = s;
      }
    }
  }

  // The group of each input column: g_idx where stored, else t / group size. Every group must
  // hold group-size columns; where g_idx reorders them, the columns are sorted by group.
  std::vector<int32_t> perm;
  if (r.find(names.g_idx) != nullptr) {
    PAGODA_ASSIGN_OR_RETURN(Tensor gi, r.get(names.g_idx, {DType::kI32}, {k}));
    std::vector<int64_t> count(static_cast<size_t>(groups));
    bool monotone = true;
    std::vector<int32_t> g_of(static_cast<size_t>(k));
    for (int64_t t = 0; t < k; ++t) {
      const auto g = static_cast<int32_t>(word(gi, t));
      if (g < 0 || g >= groups) {
        return r.fail(r.name(names.g_idx), "puts input " + std::to_string(t) + " in group " + std::to_string(g) +
                                               ", out of range [0, " + std::to_string(groups) + ")");
      }
      g_of[static_cast<size_t>(t)] = g;
      ++count[static_cast<size_t>(g)];
      monotone = monotone && g == t / g_size;
    }
    for (int64_t g = 0; g < groups; ++g) {
      if (count[static_cast<size_t>(g)] != g_size) {
        return r.fail(r.name(names.g_idx), "puts " + std::to_string(count[static_cast<size_t>(g)]) + " inputs in group " +
                                               std::to_string(g) + ", expected the group size " + std::to_string(g_size));
      }
    }
    if (!monotone) {
      perm.resize(static_cast<size_t>(k));
      std::iota(perm.begin(), perm.end(), 0);
      std::stable_sort(perm.begin(), perm.end(), [&](int32_t a, int32_t c) { return g_of[static_cast<size_t>(a)] < g_of[static_cast<size_t>(c)]; });
    }
  }

  IntCodes out;
  out.bits = b;
  out.n = n;
  out.k = k;
  out.group_size = g_size;
  out.method = q.method;
  out.scales = std::move(scales);
  const int64_t row_bytes = b == 8 ? k : k / 2;
  out.codes.assign(static_cast<size_t>(n * row_bytes), 0);
  for (int64_t j = 0; j < n; ++j) {
    uint8_t* row = out.codes.data() + j * row_bytes;
    for (int64_t t = 0; t < k; ++t) {
      const int64_t src = perm.empty() ? t : perm[static_cast<size_t>(t)];
      const int code = static_cast<int>(u[static_cast<size_t>(j * k + src)]) - static_cast<int>(half);  // [-half, half)
      if (b == 8) {
        row[t] = static_cast<uint8_t>(static_cast<int8_t>(code));
      } else {
        row[t / 2] |= static_cast<uint8_t>((code & 0xF) << (4 * (t % 2)));
      }
    }
  }
  bool any_zero = false;
  for (int32_t& v : z) {
    v -= static_cast<int32_t>(half);  // signed, as the codes
    any_zero = any_zero || v != 0;
  }
  if (any_zero) out.zero_points = std::move(z);
  out.perm = std::move(perm);
  return out;
}

Result<IntCodes> read_int8_linear(const WeightMap& weights, const std::string& path, const std::string& name,
                                  const Tensor& codes, const CheckpointQuantization& q) {
  // The scales beside the codes (compressed-tensors names: "<weight>_scale", "<...>.input_scale").
  const std::string base = name.substr(0, name.size() - 6);  // without "weight"
  const std::string scale_name = base + "weight_scale", input_name = base + "input_scale";
  const Tensor* scale = weights.find(scale_name);
  if (scale == nullptr) {
    return data_loss(path + ": tensor " + name + " holds int8 codes but " + scale_name + " is missing");
  }
  const int64_t rows = codes.num_rows(), cols = codes.row_len();
  if (cols > kMaxIntGroup) {  // per channel: one group of the whole row (kernels.h's int32 bound)
    return unimplemented(path + ": tensor " + name + " has rows of " + std::to_string(cols) +
                         " int8 codes; at most " + std::to_string(kMaxIntGroup) + " per scale are supported");
  }
  const int bits = q.bits == 4 ? 4 : 8;
  const int64_t group = q.group_size > 0 ? q.group_size : cols;
  const int64_t groups = cols % group == 0 ? cols / group : 0;
  const bool per_channel = scale->numel() == rows && (scale->ndim == 1 || (scale->ndim == 2 && scale->dim(1) == 1));
  const bool per_tensor = scale->numel() == 1 && bits == 8;
  const bool per_group = groups > 1 && scale->ndim == 2 && scale->dim(0) == rows && scale->dim(1) == groups;
  if (!(per_channel || per_tensor || per_group) || !dtype_traits(scale->dtype).dense_matmul || is_quantized(scale->dtype)) {
    const std::string want = groups > 1 ? "per group [" + std::to_string(rows) + ", " + std::to_string(groups) + "]"
                                        : "per output channel [" + std::to_string(rows) + ", 1]" +
                                              (bits == 8 ? " or per tensor [1]" : "");
    return data_loss(path + ": tensor " + scale_name + " " + scale->shape_string() + " " +
                     std::string(dtype_name(scale->dtype)) + " is not a float scale " + want + " of " + name + " " +
                     codes.shape_string());
  }
  std::vector<float> values(static_cast<size_t>(scale->numel()));
  dequantize_row(scale->dtype, scale->data, values.data(), scale->numel());
  if (per_tensor) values.assign(static_cast<size_t>(rows), values[0]);
  for (float v : values) {
    if (!(v >= 0) || !std::isfinite(v)) {
      return data_loss(path + ": tensor " + scale_name + " has a scale that is negative or not finite");
    }
  }
  float input_scale = 0;
  if (const Tensor* in = weights.find(input_name)) {
    if (in->numel() != 1 || !dtype_traits(in->dtype).dense_matmul || is_quantized(in->dtype)) {
      return data_loss(path + ": tensor " + input_name + " " + in->shape_string() + " is not one float scale");
    }
    dequantize_row(in->dtype, in->data, &input_scale, 1);
    if (!(input_scale > 0) || !std::isfinite(input_scale)) {
      return data_loss(path + ": tensor " + input_name + " is not a positive finite scale");
    }
  } else if (q.static_input_scales) {
    return data_loss(path + ": the checkpoint declares static activation scales but " + input_name +
                     " is missing");
  }
  // The codes one per byte, as compressed-tensors' int-quantized format stores them (int4 ones
  // too): copied, the int4 ones two per byte for the int4 kernel.
  if (bits == 4 && (cols % 2 != 0 || (group != cols && group % 8 != 0))) {
    return data_loss(path + ": tensor " + name + " " + codes.shape_string() + " has rows that are not whole " +
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
        return data_loss(path + ": tensor " + name + " holds " + std::to_string(in[t]) +
                         ", outside the 4-bit range [-8, 7] (row " + std::to_string(j) + ")");
      } else {
        out[t / 2] |= static_cast<uint8_t>((in[t] & 0xF) << (4 * (t % 2)));
      }
    }
  }
  return c;
}

}  // namespace pagoda
