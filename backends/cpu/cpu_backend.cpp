#include "backends/cpu/cpu_backend.h"

#include "backends/cpu/cpu_features.h"
#include "backends/cpu/cpu_thread_pool.h"
#include "backends/cpu/kernels/reference/reference_kernels.h"
#include "backends/cpu/kernels/x86/x86_kernels.h"

namespace pagoda::cpu {

Result<CpuIsa> parse_cpu_isa(std::string_view name) {
  if (name.empty() || name == "auto") return CpuIsa::kBest;
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "scalar") return CpuIsa::kScalar;
  return invalid_argument("unknown CPU ISA '" + std::string(name) + "' (auto, avx2 or scalar)");
}

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(CpuBackendOptions options) {
  const CpuFeatures& f = cpu_features();
  const bool has_avx2 = f.avx2 && f.fma && f.f16c;
  if (options.isa == CpuIsa::kAvx2 && !has_avx2) {
    return invalid_argument("the AVX2 kernels need avx2, fma and f16c; this CPU has: " + f.to_string());
  }
  Kernels k = reference_kernels();
  std::string picked;
  if (options.isa == CpuIsa::kScalar) {
    picked = "reference kernels (forced)";
  } else if (has_avx2) {
    k.matmul = matmul_avx2;
    k.pack_matmul_weight = pack_matmul_weight_avx2;
    k.paged_attention = paged_attention_avx2;
    k.rms_norm = rms_norm_avx2;
    k.silu_mul = silu_mul_avx2;
    k.add = add_avx2;
    picked = "avx2+fma+f16c matmul (packed weights), attention, rms_norm, silu_mul, add on " +
             std::to_string(cpu_thread_pool().num_threads()) +
             " threads; embedding, rope, store_kv reference";
  } else {
    picked = "reference kernels";
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(k, std::move(picked)));
}

std::string CpuBackend::description() const {
  return "cpu: " + picked_ + " (cpu features: " + cpu_features().to_string() + ")";
}

bool CpuBackend::supports_weight_type(DType) const { return true; }  // every DType converts

void register_cpu_backend(CpuBackendOptions options) {
  register_backend("cpu", [options]() -> Result<std::unique_ptr<Backend>> {
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> b, CpuBackend::create(options));
    return std::unique_ptr<Backend>(std::move(b));
  });
}

}  // namespace pagoda::cpu
