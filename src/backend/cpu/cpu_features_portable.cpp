// The CPU's features where no architecture folder reads them (cpu_features.h; x86-64 builds use
// x86/cpu_features_x86.cpp instead): on aarch64 Linux the hardware capabilities the kernel reports
// (getauxval), under the names /proc/cpuinfo gives them; on other CPUs none, so the backend runs
// the scalar reference kernels.
#include "backend/cpu/cpu_features.h"

#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

namespace pagoda::cpu {

CpuFeatures detect_cpu_features() {
  CpuFeatures f;
#if defined(__aarch64__)
  f.arch = "aarch64";
#if defined(__linux__)
  // The bits of the kernel's arch/arm64/include/uapi/asm/hwcap.h (HWCAP_ASIMD, HWCAP_ASIMDDP,
  // HWCAP_SVE; HWCAP2_I8MM, HWCAP2_BF16), spelled out so older headers do not matter.
  const unsigned long hwcap = getauxval(AT_HWCAP), hwcap2 = getauxval(AT_HWCAP2);
  auto add = [&](bool on, const char* name) {
    if (on) f.flags.emplace_back(name);
  };
  add((hwcap & (1ul << 1)) != 0, "asimd");
  add((hwcap & (1ul << 20)) != 0, "asimddp");
  add((hwcap2 & (1ul << 13)) != 0, "i8mm");
  add((hwcap2 & (1ul << 14)) != 0, "bf16");
  add((hwcap & (1ul << 22)) != 0, "sve");
#endif
#else
  f.arch = "unknown";
#endif
  return f;
}

}  // namespace pagoda::cpu
