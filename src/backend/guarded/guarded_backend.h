// GuardedBackend ("guarded"): a test backend whose memory the host cannot touch outside its kernel
// entries. It runs the CPU's scalar reference kernels over an arena of memory that is mapped
// PROT_NONE except while one of its entries runs, so any code above the backend that reads or
// writes device memory itself (a weight, the KV cache, an activation, the logits) instead of going
// through a kernel entry dies of SIGSEGV at once. A model that gives its golden output on it keeps
// to the device seam (backend/kernels.h), as an accelerator needs. Slow (two mprotect calls per
// entry, the scalar kernels) and for tests only.
//
// Thread-compatible, as any context: one engine thread calls its entries.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"

namespace pagoda::guarded {

class GuardedBackend final : public Backend {
 public:
  // Reserves the arena (virtual address space; memory is committed as it is allocated).
  static Result<std::unique_ptr<GuardedBackend>> create();

  std::string name() const override { return "guarded"; }
  std::string description() const override;
  const Kernels& kernels() const override { return kernels_; }
  bool supports_weight_type(DType t) const override;

 private:
  explicit GuardedBackend(Kernels kernels) : kernels_(std::move(kernels)) {}
  Kernels kernels_;
};

// Registers "guarded" with the backend registry.
void register_guarded_backend();

}  // namespace pagoda::guarded
