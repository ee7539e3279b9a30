#include "backends/cpu/cpu_backend.h"

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/cpu_thread_pool.h"
#include "backends/cpu/kernels/reference/reference_kernels.h"
#include "backends/cpu/kernels/x86/x86_kernels.h"

namespace pagoda::cpu {

CpuBackend::CpuBackend(CpuBackendOptions options) : kernels_(reference_kernels()) {
  const CpuFeatures& f = cpu_features();
  if (options.force_reference) {
    picked_ = "reference kernels (forced)";
  } else if (f.avx2 && f.fma && f.f16c) {
    kernels_.matmul = matmul_avx2;
    picked_ = "matmul avx2+fma+f16c on " + std::to_string(cpu_thread_pool().num_threads()) +
              " threads, other ops reference";
  } else {
    picked_ = "reference kernels";
  }
}

std::string CpuBackend::description() const {
  return "cpu: " + picked_ + " (cpu features: " + cpu_features().to_string() + ")";
}

bool CpuBackend::supports_weight_type(DType) const { return true; }  // every DType converts

void register_cpu_backend() {
  register_backend("cpu", []() -> Result<std::unique_ptr<Backend>> {
    return std::unique_ptr<Backend>(std::make_unique<CpuBackend>());
  });
}

}  // namespace pagoda::cpu
