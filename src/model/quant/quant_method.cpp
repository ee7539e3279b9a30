#include "model/quant/quant_method.h"

#include <vector>

#include "base/check.h"
#include "loader/packed_names.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

// The integer methods' projection from decoded codes: packed for the backend.
Linear make_int_linear(const Kernels& kernels, const QuantMethod& method, IntCodes codes) {
  PAGODA_CHECK((codes.bits == 8 || codes.bits == 4) && codes.group_size > 0 && codes.k % codes.group_size == 0);
  const int64_t row_bytes = codes.bits == 8 ? codes.k : codes.k / 2;
  PAGODA_CHECK(static_cast<int64_t>(codes.codes.size()) == codes.n * row_bytes &&
               static_cast<int64_t>(codes.scales.size()) == codes.n * codes.groups());
  IntWeight w;
  w.codes = codes.codes.data();
  w.bits = codes.bits;
  w.n = codes.n;
  w.k = codes.k;
  w.group_size = codes.group_size;
  w.scales = codes.scales.data();
  w.zero_points = codes.zero_points.empty() ? nullptr : codes.zero_points.data();
  w.input_scale = codes.input_scale;
  LinearWeights lw;
  lw.perm = std::move(codes.perm);
  const bool scheme = codes.method == "w4a8" || codes.method == "w8a8";  // the name says the bits
  lw.label = scheme ? codes.method : codes.method + " int" + std::to_string(codes.bits);
  if (codes.group_size != codes.k) lw.label += " g" + std::to_string(codes.group_size);
  if (!lw.perm.empty()) lw.label += " act-order";
  Buffer packed;  // the codes, scales and zero points in the device's memory
  lw.codes = kernels.pack_int_weight(w, &packed);
  lw.storage.push_back(std::move(packed));
  return Linear(method, std::move(lw));
}

// Integer codes on int8 activations: the checkpoints' codes, and those made at load.
class IntegerMethod : public QuantMethod {
 public:
  bool integer() const override { return true; }
  void apply(const Kernels& k, const Linear& l, const float* x, int64_t m, float* y) const override {
    const LinearWeights& w = l.weights();
    if (w.perm.empty()) return k.matmul_int(x, m, w.codes, y);
    // Columns reordered at load (act-order): the activations gathered the same way, into device
    // memory of the Linear's that keeps the largest batch's size (m * k floats).
    const int64_t in = w.codes.k;
    const size_t bytes = static_cast<size_t>(m * in) * sizeof(float);
    Buffer& gathered = l.scratch();
    if (gathered.size() < bytes) gathered = k.allocate(bytes);
    k.gather_columns(x, m, in, w.perm.data(), gathered.as<float>());
    k.matmul_int(gathered.as<float>(), m, w.codes, y);
  }

 protected:
  // Decoded codes: this rank's slice, packed, counted for the load log.
  Result<Linear> from_codes(WeightLoader& w, const LinearRequest& r, IntCodes codes) const {
    PAGODA_ASSIGN_OR_RETURN(codes, slice_int_codes(std::move(codes), r.slice, w.slice_context(r.name)));
    Linear l = make_int_linear(w.kernels(), *this, std::move(codes));
    w.note_type(l.type_name() + " (checkpoint)");
    return l;
  }
};

// AWQ, GPTQ, compressed-tensors pack-quantized: the tensor is absent under its own name, its packed
// parts ("qweight", "weight_packed") are there.
class PackedCheckpointMethod final : public IntegerMethod {
 public:
  std::string_view name() const override { return "packed checkpoint codes (awq, gptq, compressed-tensors)"; }
  bool applies(const WeightLoader& w, const LinearRequest& r) const override {
    const WeightMap& weights = w.source().weights;
    return weights.find(r.name) == nullptr && has_packed_linear(weights, r.name, w.config().quantization);
  }
  Result<Linear> create_weights(WeightLoader& w, const LinearRequest& r) const override {
    PAGODA_ASSIGN_OR_RETURN(IntCodes codes,
                            read_packed_linear(w.source().weights, r.name, r.rows, r.cols, w.config().quantization));
    return from_codes(w, r, std::move(codes));
  }
};

// compressed-tensors int-quantized (W8A8, W4A8): i8 codes with their scales beside them.
class Int8CheckpointMethod final : public IntegerMethod {
 public:
  std::string_view name() const override { return "int8 checkpoint codes (compressed-tensors int-quantized)"; }
  bool applies(const WeightLoader& w, const LinearRequest& r) const override {
    const Tensor* stored = w.source().weights.find(r.name);
    return stored != nullptr && stored->dtype == DType::kI8;
  }
  Result<Linear> create_weights(WeightLoader& w, const LinearRequest& r) const override {
    const ModelSource& src = w.source();
    PAGODA_ASSIGN_OR_RETURN(Tensor codes, src.weights.get(r.name, {r.rows, r.cols}));
    PAGODA_ASSIGN_OR_RETURN(IntCodes c, read_int8_linear(src.weights, src.path, r.name, codes, w.config().quantization));
    return from_codes(w, r, std::move(c));
  }
};

// --quantization w8a8 / w4a8: a layer's float projections quantized to codes at load.
class QuantizeAtLoadMethod final : public IntegerMethod {
 public:
  std::string_view name() const override { return "integer codes made at load (w8a8, w4a8)"; }
  bool applies(const WeightLoader& w, const LinearRequest& r) const override {
    const Tensor* stored = w.source().weights.find(r.name);
    return w.mix() && quant_mix_int_codes(*w.mix(), WeightSlot{r.slot.empty() ? r.name : r.slot}) &&
           stored != nullptr && !is_quantized(stored->dtype) && dtype_traits(stored->dtype).dense_matmul;
  }
  Result<Linear> create_weights(WeightLoader& w, const LinearRequest& r) const override {
    PAGODA_ASSIGN_OR_RETURN(Tensor whole, w.matrix(r.name, r.rows, r.cols));
    Buffer sliced;
    PAGODA_ASSIGN_OR_RETURN(Tensor t, slice_dense(whole, r.slice, &sliced, w.slice_context(r.name)));
    const QuantMix& mix = *w.mix();
    const int64_t in = t.row_len();
    int bits = mix.int_bits;
    const int64_t group = quant_mix_int_group(mix, in);
    if (bits == 4 && in % 2 != 0) bits = 8;  // no whole int4 pairs: int8 per channel
    if ((bits == 8 || group == in) && in > kMaxIntGroup) {
      return unimplemented(w.source().path + ": tensor " + r.name + " has rows of " + std::to_string(in) +
                           " values; " + mix.name + " takes at most " + std::to_string(kMaxIntGroup) + " per scale");
    }
    Linear l = quantize_int_linear(w.kernels(), t, bits, bits == 8 && group != in ? in : group);
    w.note_type(l.type_name());
    w.source().weights.release(r.name);  // the codes are a copy
    return l;
  }
};

// The tensor as stored, or converted to the type the load-time mix gives it.
class DenseMethod final : public QuantMethod {
 public:
  std::string_view name() const override { return "dense"; }
  bool integer() const override { return false; }
  bool applies(const WeightLoader&, const LinearRequest&) const override { return true; }
  Result<Linear> create_weights(WeightLoader& w, const LinearRequest& r) const override {
    PAGODA_ASSIGN_OR_RETURN(Tensor whole, w.matrix(r.name, r.rows, r.cols));
    Buffer sliced;
    PAGODA_ASSIGN_OR_RETURN(Tensor t, slice_dense(whole, r.slice, &sliced, w.slice_context(r.name)));
    Buffer converted;
    PAGODA_ASSIGN_OR_RETURN(Tensor typed, w.convert(r.name, r.slot.empty() ? r.name : r.slot, t, &converted));
    // The projection keeps the memory its weight points into: the conversion, else the column slice.
    Linear l = make_dense_linear(w.kernels(), typed, typed.data == t.data ? std::move(sliced) : std::move(converted));
    // Packed, converted, sliced or uploaded: a copy, and the stored tensor can go.
    const auto* p = static_cast<const uint8_t*>(l.dense_weight().data);
    const auto* begin = static_cast<const uint8_t*>(whole.data);
    if (!(p >= begin && p < begin + whole.nbytes())) w.source().weights.release(r.name);
    return l;
  }
  void apply(const Kernels& k, const Linear& l, const float* x, int64_t m, float* y) const override {
    k.matmul(x, m, l.weights().dense, y);
  }
};

const PackedCheckpointMethod kPacked;
const Int8CheckpointMethod kInt8;
const QuantizeAtLoadMethod kAtLoad;
const DenseMethod kDense;

}  // namespace

int64_t QuantMethod::weight_bytes(const Linear& l) const {
  const LinearWeights& w = l.weights();
  if (!integer()) return w.dense.nbytes();
  const int64_t per_group = w.codes.zero_points != nullptr ? 8 : 4;  // f32 scale, int32 zero point
  return w.codes.n * w.codes.row_code_bytes() + w.codes.n * w.codes.groups() * per_group +
         static_cast<int64_t>(w.perm.size() * sizeof(int32_t));
}

std::string QuantMethod::type_name(const Linear& l) const {
  const LinearWeights& w = l.weights();
  if (!integer()) return std::string(dtype_name(w.dense.dtype));
  if (!w.label.empty()) return w.label;
  std::string name = w.codes.bits == 8 ? "w8a8" : "w4a8";
  if (w.codes.group_size != w.codes.k) name += " g" + std::to_string(w.codes.group_size);
  return name;
}

std::span<const QuantMethod* const> quant_methods() {
  static const QuantMethod* const kMethods[] = {&kPacked, &kInt8, &kAtLoad, &kDense};
  return kMethods;
}

const QuantMethod& quant_method_for(const WeightLoader& w, const LinearRequest& r) {
  for (const QuantMethod* m : quant_methods()) {
    if (m->applies(w, r)) return *m;
  }
  return kDense;
}

Linear make_dense_linear(const Kernels& kernels, Tensor w, Buffer storage) {
  LinearWeights lw;
  // Packed (a copy in the device's memory) or uploaded as it is (a copy, or on the CPU the tensor
  // itself); apart from `storage`, which packing and uploading read.
  Buffer copy;
  lw.dense = kernels.table().pack_matmul_weight != nullptr ? kernels.pack_matmul_weight(w, &copy)
                                                           : kernels.upload(w, &copy);
  if (copy.size() > 0) storage = std::move(copy);  // the copy is all the matmul reads from now on
  if (storage.size() > 0) lw.storage.push_back(std::move(storage));
  return Linear(kDense, std::move(lw));
}

Linear quantize_int_linear(const Kernels& kernels, const Tensor& w, int bits, int64_t group_size) {
  PAGODA_CHECK(bits == 8 || bits == 4);
  const int64_t n = w.num_rows(), k = w.row_len();
  if (group_size <= 0) group_size = k;
  PAGODA_CHECK(k % group_size == 0 && (group_size == k || group_size % 8 == 0));
  if (bits == 4) PAGODA_CHECK(k % 2 == 0);
  const int64_t groups = k / group_size, row_bytes = bits == 8 ? k : k / 2;
  IntCodes c;
  c.bits = bits;
  c.n = n;
  c.k = k;
  c.group_size = group_size;
  c.method = bits == 8 ? "w8a8" : "w4a8";
  c.codes.assign(static_cast<size_t>(n * row_bytes), 0);
  c.scales.resize(static_cast<size_t>(n * groups));
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<int8_t> q(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    dequantize_row(w.dtype, w.row(j), row.data(), k);
    quantize_weight_row_symmetric(row.data(), k, bits, group_size, q.data(), c.scales.data() + j * groups);
    uint8_t* out = c.codes.data() + j * row_bytes;
    for (int64_t t = 0; t < k; ++t) {
      if (bits == 8) {
        out[t] = static_cast<uint8_t>(q[static_cast<size_t>(t)]);
      } else {
        out[t / 2] |= static_cast<uint8_t>((q[static_cast<size_t>(t)] & 0xF) << (4 * (t % 2)));
      }
    }
  }
  Linear l = make_int_linear(kernels, kAtLoad, std::move(c));
  return l;
}

std::optional<QuantizationFlag> parse_quantization_flag(std::string_view name) {
  using Kind = QuantizationFlag::Kind;
  auto checkpoint = [](const char* method) {
    return QuantizationFlag{.kind = Kind::kCheckpoint, .checkpoint_method = method, .mix = std::nullopt};
  };
  if (name.empty() || name == "none") return QuantizationFlag{};
  if (name == "awq" || name == "awq_marlin") return checkpoint("awq");
  if (name == "gptq" || name == "gptq_marlin") return checkpoint("gptq");
  if (name == "compressed-tensors") return checkpoint("compressed-tensors");
  if (name == "gguf") return QuantizationFlag{.kind = Kind::kGguf, .checkpoint_method = "", .mix = std::nullopt};
  std::optional<QuantMix> mix = int_codes_mix(name);
  if (!mix) mix = llama_file_type_mix(name);
  if (!mix) return std::nullopt;
  return QuantizationFlag{.kind = Kind::kLoadMix, .checkpoint_method = "", .mix = std::move(mix)};
}

std::string quantization_flag_names() {
  std::string names = "none, awq, gptq, compressed-tensors, gguf, w8a8, w4a8";
  for (const std::string& n : llama_file_type_names()) names += ", " + n;
  return names;
}

}  // namespace pagoda
