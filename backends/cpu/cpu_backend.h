// CpuBackend: the backend that runs everywhere. It picks its kernel table once, at creation,
// from the CPU's features: every op starts from the scalar reference kernels, and matmul becomes
// the AVX2 kernel (threaded over cpu_thread_pool()) where the CPU has AVX2, FMA and F16C.
// Immutable after creation: thread-safe.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace pagoda::cpu {

struct CpuBackendOptions {
  // Use the scalar reference kernels for every op whatever the CPU supports (tests compare
  // against them; also a fallback when a SIMD kernel is suspected).
  bool force_reference = false;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(CpuBackendOptions options = {});
  std::string name() const override { return "cpu"; }
  // Names the kernel picked for each op that has a variant, e.g.
  // "cpu: matmul avx2+fma+f16c on 16 threads, other ops reference (cpu features: ...)".
  std::string description() const override;
  const Kernels& kernels() const override { return kernels_; }
  bool supports_weight_type(DType t) const override;

 private:
  Kernels kernels_;
  std::string picked_;  // what description() reports of the choice
};

// Registers "cpu" with the backend registry.
void register_cpu_backend();

}  // namespace pagoda::cpu
