// WeightLoader: what a model's layers are built from. Each projection becomes a Linear as the
// checkpoint stores it and the weight mix asks (a dense Tensor converted to the mix's type, integer
// codes for w8a8 / w4a8, a checkpoint's int8 or packed codes), small vectors become f32; every
// weight's type is checked against what the backend runs. It counts what each matrix became for
// the start-up log. Used during a model's init only.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "backend/backend.h"
#include "base/status.h"
#include "loader/model_source.h"
#include "model/layers/linear.h"
#include "tensor/tensor.h"

namespace pagoda {

// A small tensor (norm weight, bias) converted to f32 once at load; empty when absent.
struct F32Vector {
  Buffer data;
  const float* ptr() const { return data.as<float>(); }
  int64_t bytes() const { return static_cast<int64_t>(data.size()); }
};

class WeightLoader {
 public:
  // `source` and `backend` must outlive the loader. linear() releases from source.weights each
  // tensor it has copied (packed, converted, quantized), so a tensor whose memory is its own (a
  // dummy weight) is freed as soon as it is copied: a load peaks at the weights' size, not twice it.
  WeightLoader(ModelSource& source, const Backend& backend)
      : source_(source), cfg_(source.config), backend_(backend), k_(backend.kernels()) {}

  // The matrix `name` ([rows, cols]) as stored, of a type the backend runs.
  Result<Tensor> matrix(const std::string& name, int64_t rows, int64_t cols);
  // t (the tensor `name`) converted to the type source.weight_mix gives it, into *storage;
  // float weights only (quantized ones stay as stored), and t itself without a mix. The mix's
  // rules see `slot_name` (a tied LM head is output.weight).
  Result<Tensor> convert(const std::string& name, const std::string& slot_name, Tensor t, Buffer* storage);
  // A projection: the tensor `name` converted as above, or quantized to integer codes under an
  // int-codes mix, or a checkpoint's int8 or packed codes (W8A8, AWQ, GPTQ, ...), in the backend's
  // packed layout where it has one; named `name` (Linear::name).
  Result<Linear> linear(const std::string& name, int64_t rows, int64_t cols, const std::string& slot_name = {});
  // The vector `name` ([len]) as f32.
  Result<F32Vector> vector(const std::string& name, int64_t len);
  // Logs what the matrices became ("weights typed by ... at load: ...") when a mix or a
  // checkpoint's quantization typed them.
  void log_types() const;

 private:
  // A projection stored as int8 codes (i8) with its scales beside it (a W8A8 / W4A8 checkpoint).
  Result<Linear> int8_linear(const std::string& name, const Tensor& codes);

  ModelSource& source_;
  const ModelConfig& cfg_;
  const Backend& backend_;
  const Kernels& k_;
  std::map<DType, int> converted_types_;  // with a weight mix: how many matrices are of each type
  std::map<std::string, int> int_types_;  // and how many became integer codes, by Linear::type_name
};

}  // namespace pagoda
