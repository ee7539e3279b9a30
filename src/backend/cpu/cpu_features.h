// What the host CPU can do: its architecture and the named features it has, read once at start-up
// by the architecture's detection (x86/cpu_features_x86.cpp: CPUID; cpu_features_portable.cpp
// elsewhere: the kernel's hardware capabilities on aarch64 Linux, nothing on other CPUs). Kernel
// tables and peak-rate loops name the features they need and are picked from these.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pagoda::cpu {

struct CpuFeatures {
  std::string arch;                // e.g. "x86_64", "aarch64"
  std::vector<std::string> flags;  // the features it has, in its detection's order, named as Linux's
                                   // /proc/cpuinfo names them on aarch64 and as GCC's -m flags on
                                   // x86 (avx2 fma f16c avx512f avx512bw avx512vl avx512vnni
                                   // avx512bf16 avxvnni; avxvnni: the VEX-encoded 256-bit
                                   // vpdpbusd of Alder Lake, Sapphire Rapids and Zen 5)

  bool has(std::string_view flag) const;
  // Whether it has every feature of the space-separated `flags` (true for none).
  bool has_all(std::string_view flags) const;
  std::string to_string() const;  // the flags, space-separated, e.g. "avx2 fma f16c avx512f"; "none"
};

// The features of this machine (computed once; thread-safe).
const CpuFeatures& cpu_features();

// Reads the features of this machine: defined by the architecture's detection file (see above).
CpuFeatures detect_cpu_features();

}  // namespace pagoda::cpu
