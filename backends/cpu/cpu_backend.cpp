#include "backends/cpu/cpu_backend.h"

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels/reference/reference_kernels.h"

namespace pagoda::cpu {

CpuBackend::CpuBackend() : kernels_(reference_kernels()) {}

std::string CpuBackend::description() const {
  return "cpu: reference kernels (cpu features: " + cpu_features().to_string() + ")";
}

bool CpuBackend::supports_weight_type(DType) const { return true; }  // every DType converts

void register_cpu_backend() {
  register_backend("cpu", []() -> Result<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
  });
}

}  // namespace pagoda::cpu
