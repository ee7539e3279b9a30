// The x86-64 CPU's features, read with CPUID (cpu_features.h): the instruction sets the x86 kernel
// tables and peak-rate loops need, named as GCC's -m flags name them.
#include <cpuid.h>

#include "backend/cpu/cpu_features.h"

namespace pagoda::cpu {

CpuFeatures detect_cpu_features() {
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2");
  const bool avx512f = __builtin_cpu_supports("avx512f");
  bool f16c = false, avxvnni = false, avx512bf16 = false;
  unsigned a, b, c, d;
  if (__get_cpuid(1, &a, &b, &c, &d)) f16c = (c & bit_F16C) != 0;
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
    avxvnni = avx2 && (a & (1u << 4)) != 0;  // its YMM state is AVX's, which avx2 implies
    avx512bf16 = avx512f && (a & (1u << 5)) != 0;
  }
  CpuFeatures f{.arch = "x86_64", .flags = {}};
  auto add = [&](bool on, const char* name) {
    if (on) f.flags.emplace_back(name);
  };
  add(avx2, "avx2");
  add(__builtin_cpu_supports("fma"), "fma");
  add(f16c, "f16c");
  add(avx512f, "avx512f");
  add(__builtin_cpu_supports("avx512bw"), "avx512bw");
  add(__builtin_cpu_supports("avx512vl"), "avx512vl");
  add(__builtin_cpu_supports("avx512vnni"), "avx512vnni");
  add(avx512bf16, "avx512bf16");
  add(avxvnni, "avxvnni");
  return f;
}

}  // namespace pagoda::cpu
