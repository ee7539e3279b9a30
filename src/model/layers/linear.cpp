#include "model/layers/linear.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

thread_local LinearInputObserver* t_observer = nullptr;

// Shows the observer a projection's input, copied to the host (it is device memory).
void observe(const Kernels& kernels, const std::string& name, const float* x, int64_t m, int64_t k) {
  thread_local std::vector<float> host;
  host.resize(static_cast<size_t>(m * k));
  kernels.copy_to_host(host.data(), x, host.size() * sizeof(float));
  t_observer->observe(name, host.data(), m, k);
}

}  // namespace

ScopedLinearInputObserver::ScopedLinearInputObserver(LinearInputObserver* observer) : previous_(t_observer) {
  t_observer = observer;
}

ScopedLinearInputObserver::~ScopedLinearInputObserver() { t_observer = previous_; }

Linear Linear::dense(const Kernels& kernels, Tensor w, Buffer storage) {
  Linear l;
  // Packed (a copy in the device's memory) or uploaded as it is (a copy, or on the CPU the tensor
  // itself); apart from `storage`, which packing and uploading read.
  Buffer copy;
  w = kernels.table().pack_matmul_weight != nullptr ? kernels.pack_matmul_weight(w, &copy) : kernels.upload(w, &copy);
  if (copy.size() > 0) storage = std::move(copy);  // the copy is all the matmul reads from now on
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
  Buffer codes(static_cast<size_t>(n * row_bytes));
  Buffer scales(static_cast<size_t>(n * groups) * sizeof(float));
  std::vector<float> row(static_cast<size_t>(k));
  std::vector<int8_t> q(static_cast<size_t>(k));
  for (int64_t j = 0; j < n; ++j) {
    dequantize_row(w.dtype, w.row(j), row.data(), k);
    quantize_weight_row_symmetric(row.data(), k, bits, group_size, q.data(), scales.as<float>() + j * groups);
    uint8_t* out = codes.as<uint8_t>() + j * row_bytes;
    for (int64_t t = 0; t < k; ++t) {
      if (bits == 8) {
        out[t] = static_cast<uint8_t>(q[static_cast<size_t>(t)]);
      } else {
        out[t / 2] |= static_cast<uint8_t>((q[static_cast<size_t>(t)] & 0xF) << (4 * (t % 2)));
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
  Buffer packed;  // the codes and scales in the device's memory
  l.int_ = kernels.pack_int_weight(l.int_, &packed);
  l.storage_.push_back(std::move(packed));
  return l;
}

Linear Linear::int_codes(const Kernels& kernels, IntCodes codes) {
  PAGODA_CHECK((codes.bits == 8 || codes.bits == 4) && codes.group_size > 0 && codes.k % codes.group_size == 0);
  const int64_t row_bytes = codes.bits == 8 ? codes.k : codes.k / 2;
  PAGODA_CHECK(static_cast<int64_t>(codes.codes.size()) == codes.n * row_bytes &&
               static_cast<int64_t>(codes.scales.size()) == codes.n * codes.groups());
  Linear l;
  l.is_int_ = true;
  l.int_.codes = codes.codes.data();
  l.int_.bits = codes.bits;
  l.int_.n = codes.n;
  l.int_.k = codes.k;
  l.int_.group_size = codes.group_size;
  l.int_.scales = codes.scales.data();
  l.int_.zero_points = codes.zero_points.empty() ? nullptr : codes.zero_points.data();
  l.perm_ = std::move(codes.perm);
  l.int_.input_scale = codes.input_scale;
  const bool scheme = codes.method == "w4a8" || codes.method == "w8a8";  // the name says the bits
  l.label_ = scheme ? codes.method : codes.method + " int" + std::to_string(codes.bits);
  if (codes.group_size != codes.k) l.label_ += " g" + std::to_string(codes.group_size);
  if (!l.perm_.empty()) l.label_ += " act-order";
  Buffer packed;  // the codes, scales and zero points in the device's memory
  l.int_ = kernels.pack_int_weight(l.int_, &packed);
  l.storage_.push_back(std::move(packed));
  return l;
}

void Linear::apply(const Kernels& kernels, const float* x, int64_t m, float* y) const {
  if (t_observer != nullptr) observe(kernels, name_, x, m, in_features());
  if (is_int_ && !perm_.empty()) {
    // Columns reordered at load (act-order): the activations gathered the same way, into device
    // memory of this Linear's that keeps the largest batch's size (m * k floats).
    const int64_t k = int_.k;
    const size_t bytes = static_cast<size_t>(m * k) * sizeof(float);
    if (gathered_.size() < bytes) gathered_ = kernels.allocate(bytes);
    kernels.gather_columns(x, m, k, perm_.data(), gathered_.as<float>());
    kernels.matmul_int(gathered_.as<float>(), m, int_, y);
  } else if (is_int_) {
    kernels.matmul_int(x, m, int_, y);
  } else {
    kernels.matmul(x, m, dense_, y);
  }
}

bool Linear::shares_dense_call(const Linear& a, const Linear& b) {
  return !a.is_int_ && !b.is_int_ && a.dense_.dtype == b.dense_.dtype && a.dense_.layout == b.dense_.layout &&
         a.dense_.row_len() == b.dense_.row_len();
}

void Linear::apply_many(const Kernels& kernels, const float* x, int64_t m, const Linear* const* ls,
                        float* const* ys, int count) {
  constexpr int kMax = 4;
  PAGODA_CHECK(count >= 1 && count <= kMax);
  bool fuse = kernels.table().matmul_many != nullptr && count > 1;
  const Tensor* ws[kMax];
  for (int i = 0; i < count && fuse; ++i) {
    const Tensor& w = ls[i]->dense_;
    ws[i] = &w;
    fuse = shares_dense_call(*ls[i], *ls[0]);
  }
  if (!fuse) {
    for (int i = 0; i < count; ++i) ls[i]->apply(kernels, x, m, ys[i]);
    return;
  }
  if (t_observer != nullptr) {
    for (int i = 0; i < count; ++i) observe(kernels, ls[i]->name_, x, m, ls[i]->in_features());
  }
  kernels.matmul_many(x, m, ws, ys, count);
}

void Linear::apply_grouped(const Kernels& kernels, const float* x, const LinearGroup* groups, int count) {
  if (count <= 0) return;
  const Linear& first = *groups[0].linear;
  bool fuse = kernels.table().matmul_grouped != nullptr;
  for (int g = 0; g < count && fuse; ++g) {
    const Linear& l = *groups[g].linear;
    fuse = shares_dense_call(l, first);
  }
  if (!fuse) {
    const int64_t k = first.in_features();
    for (int g = 0; g < count; ++g) {
      if (groups[g].m > 0) groups[g].linear->apply(kernels, x + groups[g].row * k, groups[g].m, groups[g].y);
    }
    return;
  }
  thread_local std::vector<MatmulGroup> products;
  products.clear();
  for (int g = 0; g < count; ++g) {
    const LinearGroup& lg = groups[g];
    if (lg.m == 0) continue;
    if (t_observer != nullptr) {
      observe(kernels, lg.linear->name_, x + lg.row * first.in_features(), lg.m, first.in_features());
    }
    products.push_back(MatmulGroup{lg.row, lg.m, &lg.linear->dense_, lg.y});
  }
  if (!products.empty()) kernels.matmul_grouped(x, products.data(), static_cast<int>(products.size()));
}

int64_t Linear::weight_bytes() const {
  if (!is_int_) return dense_.nbytes();
  const int64_t per_group = int_.zero_points != nullptr ? 8 : 4;  // f32 scale, int32 zero point
  return int_.n * int_.row_code_bytes() + int_.n * int_.groups() * per_group +
         static_cast<int64_t>(perm_.size() * sizeof(int32_t));
}

std::string Linear::type_name() const {
  if (!is_int_) return std::string(dtype_name(dense_.dtype));
  if (!label_.empty()) return label_;
  std::string name = int_.bits == 8 ? "w8a8" : "w4a8";
  if (int_.group_size != int_.k) name += " g" + std::to_string(int_.group_size);
  return name;
}

}  // namespace pagoda
