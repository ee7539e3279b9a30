// WeightLoader: what a model's layers are built from. Each projection becomes a Linear as the
// checkpoint stores it and the weight mix asks (a dense Tensor converted to the mix's type, integer
// codes for w8a8 / w4a8, a checkpoint's int8 or packed codes), small vectors become f32; every
// weight's type is checked against what the backend runs. It counts what each matrix became for
// the start-up log. Under tensor parallelism it hands out this rank's slice of each projection
// (model/tensor_parallel.h). Used during a model's init only.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "base/status.h"
#include "loader/model_source.h"
#include "model/layers/linear.h"
#include "model/quant/packed_linear.h"
#include "model/quant/quant_mix.h"
#include "model/tensor_parallel.h"
#include "tensor/tensor.h"

namespace pagoda {

// A small tensor (norm weight, bias) converted to f32 once at load, in the device's memory;
// empty when absent.
struct F32Vector {
  Buffer data;
  const float* ptr() const { return data.as<float>(); }
  int64_t bytes() const { return static_cast<int64_t>(data.size()); }
};

// The part of a projection [out, in] a tensor-parallel rank holds: output features (rows:
// column-parallel layers) or input features (columns: row-parallel ones) [begin, end), or all.
struct Slice {
  enum class Dim { kWhole, kRows, kCols };
  Dim dim = Dim::kWhole;
  IndexRange range;
  static Slice rows(IndexRange r) { return Slice{Dim::kRows, r}; }
  static Slice cols(IndexRange r) { return Slice{Dim::kCols, r}; }
};

// Part of a dense matrix [rows, cols] of any DType: a view of its rows, or its columns copied
// into *storage; a column range that cuts a quantized block is refused, naming `context`.
Result<Tensor> slice_dense(const Tensor& t, const Slice& slice, Buffer* storage, const std::string& context);
// Part of a projection's integer codes, with their scales, zero points and column permutation
// (GPTQ's act-order: the code columns whose input columns fall in the range). A column range
// that takes part of a scale group (unless one scale covers the row), or an odd number of int4
// columns, is refused, naming `context`.
Result<IntCodes> slice_int_codes(IntCodes c, const Slice& slice, const std::string& context);

class WeightLoader {
 public:
  // `source` and `backend` must outlive the loader. linear() releases from source.weights each
  // tensor it has copied (packed, converted, quantized), so a tensor whose memory is its own (a
  // dummy weight) is freed as soon as it is copied: a load peaks at the weights' size, not twice it.
  // `plan`: the shard this rank holds (unsharded(source.config) for the whole model). `mix`: the
  // types --dtype or --quantization give float weights at load (model/quant/quant_mix.h).
  WeightLoader(ModelSource& source, const Backend& backend, ShardPlan plan, std::optional<QuantMix> mix = std::nullopt)
      : source_(source), cfg_(source.config), backend_(backend), k_(backend.kernels()), plan_(std::move(plan)),
        mix_(std::move(mix)) {}
  WeightLoader(ModelSource& source, const Backend& backend)
      : WeightLoader(source, backend, unsharded(source.config)) {}

  const ShardPlan& shard() const { return plan_; }
  // What the quant methods (model/quant/quant_method.h) read and make the weights with.
  ModelSource& source() const { return source_; }
  const ModelConfig& config() const { return cfg_; }
  const std::optional<QuantMix>& mix() const { return mix_; }
  const Kernels& kernels() const { return k_; }
  // "<source>: tensor <name> (tensor-parallel rank r of n)": what a refused slice names.
  std::string slice_context(const std::string& name) const;
  // Counts a projection of integer codes of this type for the load log (log_types).
  void note_type(const std::string& type) { ++int_types_[type]; }

  // The matrix `name` ([rows, cols]) as stored, of a type the backend runs; matrix_rows: a view
  // of its rows [part.begin, part.end).
  Result<Tensor> matrix(const std::string& name, int64_t rows, int64_t cols);
  Result<Tensor> matrix_rows(const std::string& name, int64_t rows, int64_t cols, IndexRange part);
  // t (the tensor `name`) converted to the type source.weight_mix gives it, into *storage;
  // float weights only (quantized ones stay as stored), and t itself without a mix. The mix's
  // rules see `slot_name` (a tied LM head is output.weight).
  Result<Tensor> convert(const std::string& name, const std::string& slot_name, Tensor t, Buffer* storage);
  // A projection, made by the quant method the registry picks for it (model/quant/quant_method.h:
  // a checkpoint's packed or int8 codes, codes made at load, or dense as stored or converted as
  // above), in the backend's packed layout where it has one; named `name` (Linear::name). rows and
  // cols are the whole tensor's; `slice` picks this rank's part of it. A quantized weight whose
  // blocks (GGUF types) or scale groups (integer codes) a column slice would cut is refused,
  // naming the tensor.
  Result<Linear> linear(const std::string& name, int64_t rows, int64_t cols, const std::string& slot_name = {},
                        Slice slice = {});
  // The vector `name` ([len]) as f32; with `part`, its elements [part.begin, part.end).
  Result<F32Vector> vector(const std::string& name, int64_t len);
  Result<F32Vector> vector(const std::string& name, int64_t len, IndexRange part);
  // Logs what the matrices became ("weights typed by ... at load: ...") when a mix or a
  // checkpoint's quantization typed them.
  void log_types() const;

 private:

  ModelSource& source_;
  const ModelConfig& cfg_;
  const Backend& backend_;
  const Kernels& k_;
  ShardPlan plan_;
  std::optional<QuantMix> mix_;
  std::map<DType, int> converted_types_;  // with a weight mix: how many matrices are of each type
  std::map<std::string, int> int_types_;  // and how many became integer codes, by Linear::type_name
};

}  // namespace pagoda
