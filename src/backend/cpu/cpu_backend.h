// CpuBackend: the backend that runs everywhere. It picks its kernel table once, at creation, from
// the CPU's features (or a forced ISA): every op starts from the scalar reference kernels, and
// matmul, paged attention and the element-wise ops become the AVX2 kernels (threaded over
// cpu_thread_pool()) where the CPU has AVX2, FMA and F16C. Immutable after creation: thread-safe.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "base/status.h"

namespace pagoda::cpu {

// Which kernel table to use. kBest: the best the CPU supports. kAvx512Bf16: the avx512vnni kernels
// with f16 and bf16 weights on vdpbf16ps (inputs, and f16 weights, rounded to bf16). kAvx512Vnni:
// the AVX2 kernels with the integer matmul and the batched q8_0 / q4_x / q5_x products on 512-bit
// AVX-512 VNNI, the other block-type products on its 256-bit form (AVX-512 VL; no AVX-VNNI needed);
// kAvx512: the AVX2 kernels with the batched f32 / f16 / bf16 products on 512-bit FMAs (AVX-512
// F and BW, no VNNI: Skylake-SP); kAvxVnni: the AVX2 kernels with the block-type and integer matmuls on AVX-VNNI; kAvx2: the AVX2
// kernels (each an error on a CPU without them). kScalar: the scalar reference kernels for every
// op (tests compare against them; also a fallback when a SIMD kernel is suspected).
enum class CpuIsa { kBest, kAvx512Bf16, kAvx512Vnni, kAvx512, kAvxVnni, kAvx2, kScalar };

// "avx512bf16", "avx512vnni", "avx512", "avxvnni", "avx2" or "scalar" (the values of PAGODA_CPU_ISA); "" or "auto" is
// kBest.
Result<CpuIsa> parse_cpu_isa(std::string_view name);

struct CpuBackendOptions {
  CpuIsa isa = CpuIsa::kBest;
};

struct CpuFeatures;

// A SIMD kernel table compiled into this binary: the kernels it puts over the reference ones, and
// the CPU features they need. Every table CpuBackend can pick is in cpu_kernel_tables() and is
// picked from there, so tests can enumerate them (kernels/kernel_table_coverage_test.cpp checks
// that every entry a table replaces has a test).
struct CpuKernelTable {
  CpuIsa isa;                               // the CpuIsa that forces it
  std::string_view name;                    // e.g. "avx2", as PAGODA_CPU_ISA spells it
  std::string_view needs;                   // the features it needs, e.g. "avx2 fma f16c"
  bool (*supported)(const CpuFeatures& f);  // whether a CPU with features `f` can run it
  void (*install)(Kernels* k);              // sets the entries it replaces in *k
  std::string_view replaced;                // for description(): what it replaces
  std::string_view kept;                    // for description(): what stays on the reference
};

// The SIMD kernel tables compiled into this binary, best first; CpuIsa::kBest picks the first
// one the CPU supports, or the reference kernels where it supports none.
std::span<const CpuKernelTable> cpu_kernel_tables();

class CpuBackend final : public Backend {
 public:
  // Fails when options.isa asks for instructions this CPU lacks.
  static Result<std::unique_ptr<CpuBackend>> create(CpuBackendOptions options = {});

  std::string name() const override { return "cpu"; }
  // Names the kernels picked, e.g. "cpu: avx2+fma+f16c matmul, ... on 16 threads; ... reference
  // (cpu features: ...)".
  std::string description() const override;
  const Kernels& kernels() const override { return kernels_; }
  bool supports_weight_type(DType t) const override;

 private:
  CpuBackend(Kernels kernels, std::string picked) : kernels_(kernels), picked_(std::move(picked)) {}
  Kernels kernels_;
  std::string picked_;  // what description() reports of the choice
};

// Registers "cpu" with the backend registry; every backend it creates uses `options`.
void register_cpu_backend(CpuBackendOptions options = {});

}  // namespace pagoda::cpu
