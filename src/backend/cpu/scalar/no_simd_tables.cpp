// A build for an architecture without a SIMD folder here (../CMakeLists.txt): no kernel tables, so
// the backend runs the scalar reference kernels, and no peak-rate loops, so MachineLimits times
// its portable scalar loops.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/machine_peaks.h"

namespace pagoda::cpu {

std::span<const CpuKernelTable> arch_kernel_tables() { return {}; }

const ArchPeakLoops& arch_peak_loops() {
  static const ArchPeakLoops none;
  return none;
}

}  // namespace pagoda::cpu
