#include "model/layers/linear.h"

#include <vector>

#include "base/check.h"
#include "model/quant/quant_method.h"

namespace pagoda {
namespace {

thread_local LinearInputObserver* t_observer = nullptr;

}  // namespace

ScopedLinearInputObserver::ScopedLinearInputObserver(LinearInputObserver* observer) : previous_(t_observer) {
  t_observer = observer;
}

ScopedLinearInputObserver::~ScopedLinearInputObserver() { t_observer = previous_; }

void Linear::observe(const Kernels& kernels, const float* x, int64_t m) const {
  if (t_observer == nullptr) return;
  // The input is device memory: the observer sees a copy on the host.
  thread_local std::vector<float> host;
  const int64_t k = in_features();
  host.resize(static_cast<size_t>(m * k));
  kernels.copy_to_host(host.data(), x, host.size() * sizeof(float));
  t_observer->observe(name_, host.data(), m, k);
}

void Linear::apply(const Kernels& kernels, const float* x, int64_t m, float* y) const {
  observe(kernels, x, m);
  method_->apply(kernels, *this, x, m, y);
}

bool Linear::is_int() const { return method_->integer(); }

int64_t Linear::weight_bytes() const { return method_->weight_bytes(*this); }

std::string Linear::type_name() const { return method_->type_name(*this); }

bool Linear::shares_dense_call(const Linear& a, const Linear& b) {
  return !a.is_int() && !b.is_int() && a.w_.dense.dtype == b.w_.dense.dtype && a.w_.dense.layout == b.w_.dense.layout &&
         a.w_.dense.row_len() == b.w_.dense.row_len();
}

void Linear::apply_many(const Kernels& kernels, const float* x, int64_t m, const Linear* const* ls,
                        float* const* ys, int count) {
  constexpr int kMax = 4;
  PAGODA_CHECK(count >= 1 && count <= kMax);
  bool fuse = kernels.table().matmul_many != nullptr && count > 1;
  const Tensor* ws[kMax];
  for (int i = 0; i < count && fuse; ++i) {
    ws[i] = &ls[i]->w_.dense;
    fuse = shares_dense_call(*ls[i], *ls[0]);
  }
  if (!fuse) {
    for (int i = 0; i < count; ++i) ls[i]->apply(kernels, x, m, ys[i]);
    return;
  }
  for (int i = 0; i < count; ++i) ls[i]->observe(kernels, x, m);
  kernels.matmul_many(x, m, ws, ys, count);
}

void Linear::apply_grouped(const Kernels& kernels, const float* x, const LinearGroup* groups, int count) {
  if (count <= 0) return;
  const Linear& first = *groups[0].linear;
  bool fuse = kernels.table().matmul_grouped != nullptr;
  for (int g = 0; g < count && fuse; ++g) fuse = shares_dense_call(*groups[g].linear, first);
  const int64_t k = first.in_features();
  if (!fuse) {
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
    lg.linear->observe(kernels, x + lg.row * k, lg.m);
    products.push_back(MatmulGroup{lg.row, lg.m, &lg.linear->w_.dense, lg.y});
  }
  if (!products.empty()) kernels.matmul_grouped(x, products.data(), static_cast<int>(products.size()));
}

}  // namespace pagoda
