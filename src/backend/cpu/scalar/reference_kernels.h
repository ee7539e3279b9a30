// The scalar reference kernels of the CPU backend: the oracle every faster variant is checked
// against, written for clarity first. Stateless; thread-safe.
#pragma once

#include "backend/kernels.h"

namespace pagoda::cpu {

// The reference Kernels table.
const Kernels& reference_kernels();

}  // namespace pagoda::cpu
