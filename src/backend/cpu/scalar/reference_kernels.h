// The scalar reference kernels of the CPU backend: the oracle every faster variant is checked
// against, written for clarity first. Stateless; thread-safe.
#pragma once

#include "backend/kernels.h"

namespace pagoda::cpu {

// The reference kernel table. Its entries use nothing of their context (single-threaded), so it
// runs under any backend's context (the guarded test backend's too).
const KernelTable& reference_kernels();

}  // namespace pagoda::cpu
