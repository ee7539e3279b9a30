// CpuBackend: the backend that runs everywhere. It picks its kernel table once, at creation,
// from the CPU's features (today: the scalar reference kernels on every machine; SIMD variants
// arrive with the kernels issue). Immutable after creation: thread-safe.
#pragma once

#include <memory>

#include "backend/backend.h"

namespace pagoda::cpu {

class CpuBackend final : public Backend {
 public:
  CpuBackend();
  std::string name() const override { return "cpu"; }
  std::string description() const override;
  const Kernels& kernels() const override { return kernels_; }
  bool supports_weight_type(DType t) const override;

 private:
  Kernels kernels_;
};

// Registers "cpu" with the backend registry.
void register_cpu_backend();

}  // namespace pagoda::cpu
