// What the host x86-64 CPU can do, read once with CPUID. Used to pick kernel variants at start-up.
#pragma once

#include <string>

namespace pagoda::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avxvnni = false;  // AVX-VNNI: the VEX-encoded 256-bit vpdpbusd (Alder Lake, Sapphire Rapids, Zen 5)

  std::string to_string() const;  // e.g. "avx2 fma f16c avx512f"
};

// The features of this machine (computed once; thread-safe).
const CpuFeatures& cpu_features();

}  // namespace pagoda::cpu
