#include "model/layers/linear.h"

#include <algorithm>
#include <cmath>

#include "base/check.h"
#include "tensor/convert.h"

namespace pagoda {

Linear Linear::dense(const Kernels& kernels, Tensor w, Buffer storage) {
  Linear l;
  if (kernels.pack_matmul_weight != nullptr) {
    Buffer packed;  // apart from `storage`, which packing reads
    w = kernels.pack_matmul_weight(w, &packed);
    storage = std::move(packed);  // the packed copy is all the matmul reads from now on
  }
  l.dense_ = w;
  if (storage.size() > 0) l.storage_.push_back(std::move(storage));
  return l;
}

Linear Linear::quantize_int(const Kernels& kernels, const Tensor& w, int bits, int64_t group_size) {
  PAGODA_CHECK(bits == 8 || bits == 4);
  const int64_t n = w.num_rows(), k = w.row_len();
  if (group_size <= 0) group_size = k;
  PAGODA_CHECK(k % group_size == 0 && (group_size == k || group_size % 8 == 0));
  if (bits == 4) PAGODA_CHECK(k % 2 == 0);
  const int64_t groups = k / group_size, row_bytes = bits == 8 ? k : k / 2;
  const float qmax = bits == 8 ? 127.0f : 7.0f;
  Buffer codes(static_cast<size_t>(n * row_bytes));
  Buffer scales(static_cast<size_t>(n * groups) * sizeof(float));
  std::vector<float> row(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    dequantize_row(w.dtype, w.row(j), row.data(), k);
    uint8_t* out = codes.as<uint8_t>() + j * row_bytes;
    for (int64_t g = 0; g < groups; ++g) {
      const float* x = row.data() + g * group_size;
      float amax = 0;
      for (int64_t t = 0; t < group_size; ++t) amax = std::fmax(amax, std::fabs(x[t]));
      const float scale = amax / qmax;
      const float inv = amax != 0 ? qmax / amax : 0.0f;
      scales.as<float>()[j * groups + g] = scale;
      for (int64_t t = 0; t < group_size; ++t) {
        const float v = std::nearbyint(x[t] * inv);
        const int q = static_cast<int>(v > qmax ? qmax : (v < -qmax ? -qmax : v));
        const int64_t col = g * group_size + t;
        if (bits == 8) {
          out[col] = static_cast<uint8_t>(static_cast<int8_t>(q));
        } else {
          out[col / 2] |= static_cast<uint8_t>((q & 0xF) << (4 * (col % 2)));
        }
      }
    }
  }
  Linear l;
  l.is_int_ = true;
  l.int_.codes = codes.data();
  l.int_.bits = bits;
  l.int_.n = n;
  l.int_.k = k;
  l.int_.group_size = group_size;
  l.int_.scales = scales.as<float>();
  if (kernels.pack_int_weight != nullptr) {
    Buffer packed;
    l.int_ = kernels.pack_int_weight(l.int_, &packed);
    l.storage_.push_back(std::move(packed));
  } else {
    l.storage_.push_back(std::move(codes));
    l.storage_.push_back(std::move(scales));
  }
  return l;
}

Linear Linear::int8_codes(const Kernels& kernels, const Tensor& codes, std::vector<float> scales, float input_scale) {
  PAGODA_CHECK(codes.dtype == DType::kI8 && static_cast<int64_t>(scales.size()) == codes.num_rows());
  Linear l;
  l.is_int_ = true;
  Buffer scale_buffer(scales.size() * sizeof(float));
  std::copy(scales.begin(), scales.end(), scale_buffer.as<float>());
  l.int_.codes = codes.data;
  l.int_.bits = 8;
  l.int_.n = codes.num_rows();
  l.int_.k = codes.row_len();
  l.int_.group_size = codes.row_len();
  l.int_.scales = scale_buffer.as<float>();
  l.int_.input_scale = input_scale;
  if (kernels.pack_int_weight != nullptr) {
    Buffer packed;
    l.int_ = kernels.pack_int_weight(l.int_, &packed);
    l.storage_.push_back(std::move(packed));
  } else {
    l.storage_.push_back(std::move(scale_buffer));
  }
  return l;
}

void Linear::apply(const Kernels& kernels, const float* x, int64_t m, float* y) const {
  if (is_int_) {
    kernels.matmul_int(x, m, int_, y);
  } else {
    kernels.matmul(x, m, dense_, y);
  }
}

int64_t Linear::weight_bytes() const {
  if (!is_int_) return dense_.nbytes();
  return int_.n * int_.row_code_bytes() + int_.n * int_.groups() * static_cast<int64_t>(sizeof(float));
}

std::string Linear::type_name() const {
  if (!is_int_) return std::string(dtype_name(dense_.dtype));
  std::string name = int_.bits == 8 ? "w8a8" : "w4a8";
  if (int_.group_size != int_.k) name += " g" + std::to_string(int_.group_size);
  return name;
}

}  // namespace pagoda
