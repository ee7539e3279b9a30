// A CPU context for the tests and micro-benchmarks that call a kernel table's entries directly
// (the engine's contexts belong to its backends): one pool of physical_cores() threads, made on
// first use.
#pragma once

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_thread_pool.h"

namespace pagoda::cpu {

inline const CpuContext& testing_context() {
  static const CpuContext context(physical_cores());
  return context;
}

}  // namespace pagoda::cpu
