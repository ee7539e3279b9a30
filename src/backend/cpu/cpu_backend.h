// CpuBackend: the backend that runs everywhere. Its device memory is host memory, and its
// execution context (CpuContext) owns the thread pool its kernels split their work over. It picks
// its kernel table once, at creation, from the CPU's features (or a forced ISA): every op starts
// from the scalar reference kernels, and matmul, paged attention and the element-wise ops become
// the SIMD kernels of this architecture's tables (x86/: AVX2 and up) where the CPU has what they
// need. Immutable after creation: thread-safe.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "base/status.h"
#include "base/thread_pool.h"

namespace pagoda::cpu {

// The kernel table CpuBackend runs, by the name PAGODA_CPU_ISA gives it: "auto" (or "") the best
// the CPU supports; "scalar" the scalar reference kernels for every op (tests compare against
// them; also a fallback when a SIMD kernel is suspected); any other name the table of
// cpu_kernel_tables() of that name (e.g. "avx2": x86/x86_tables.cpp lists them), an error on a CPU
// without what it needs.
struct CpuBackendOptions {
  std::string isa = "auto";
  int threads = 0;  // the pool's threads, the caller included; 0: one per physical core (physical_cores())
};

// `name` as CpuBackendOptions::isa takes it ("" is "auto"), or an error when it is not auto,
// scalar or the name of a compiled table (the message lists them).
Result<std::string> parse_cpu_isa(std::string_view name);

// The CPU's execution context: host memory, and the thread pool the kernels split their work over
// (the engine thread calls; the pool's workers join it). A context's kernels are called by one
// thread at a time.
class CpuContext final : public ExecContext {
 public:
  explicit CpuContext(int threads) : pool_(std::make_unique<ThreadPool>(threads)) {}
  Buffer allocate(size_t bytes) const override { return Buffer(bytes); }
  ThreadPool& pool() const { return *pool_; }

 private:
  std::unique_ptr<ThreadPool> pool_;
};

// The pool of the context a CPU kernel runs in (only the CPU tables' own entries call it).
inline ThreadPool& pool_of(const ExecContext& ctx) { return static_cast<const CpuContext&>(ctx).pool(); }

struct CpuFeatures;

// A SIMD kernel table compiled into this binary: the kernels it puts over the reference ones, and
// the CPU features they need. Every table CpuBackend can pick is in cpu_kernel_tables() and is
// picked from there, so tests can enumerate them (kernel_table_coverage_test.cpp checks
// that every entry a table replaces has a test).
struct CpuKernelTable {
  std::string_view name;                    // e.g. "avx2", as PAGODA_CPU_ISA spells it (CpuBackendOptions::isa)
  std::string_view needs;                   // the features it needs, e.g. "avx2 fma f16c"
  bool (*supported)(const CpuFeatures& f);  // whether a CPU with features `f` can run it
  void (*install)(KernelTable* k);          // sets the entries it replaces in *k
  std::string_view replaced;                // for description(): what it replaces
  std::string_view kept;                    // for description(): what stays on the reference
};

// The SIMD kernel tables compiled into this binary, best first; "auto" picks the first one the CPU
// supports, or the reference kernels where it supports none.
std::span<const CpuKernelTable> cpu_kernel_tables();

// The compiled table named `name`, or nullptr.
const CpuKernelTable* find_cpu_kernel_table(std::string_view name);

// This architecture's tables, best first, which cpu_kernel_tables() returns: defined by its folder
// (x86/x86_tables.cpp), or empty (scalar/no_simd_tables.cpp) where this build has none.
std::span<const CpuKernelTable> arch_kernel_tables();

class CpuBackend final : public Backend {
 public:
  // Fails when options.isa asks for instructions this CPU lacks. `context`: the context to run in
  // (one created with options.threads when null), so that the models of one process share a pool.
  static Result<std::unique_ptr<CpuBackend>> create(CpuBackendOptions options = {},
                                                    std::shared_ptr<const CpuContext> context = nullptr);

  std::string name() const override { return "cpu"; }
  // Names the kernels picked, e.g. "cpu: avx2+fma+f16c matmul, ... on 16 threads; ... reference
  // (cpu features: ...)".
  std::string description() const override;
  const Kernels& kernels() const override { return kernels_; }
  bool supports_weight_type(DType t) const override;
  std::shared_ptr<const CpuContext> context() const { return context_; }

 private:
  CpuBackend(const KernelTable& table, std::shared_ptr<const CpuContext> context, std::string picked)
      : kernels_(table, context), context_(std::move(context)), picked_(std::move(picked)) {}
  Kernels kernels_;
  std::shared_ptr<const CpuContext> context_;
  std::string picked_;  // what description() reports of the choice
};

// `table` (one of this backend's) bound to a CPU context of its own with `threads` threads: for
// tests and benchmarks that call a table's entries directly.
Kernels cpu_kernels(const KernelTable& table, int threads = 1);

// Registers "cpu" with the backend registry; every backend it creates uses `options` (the
// registry's BackendOptions::threads, when set, for the pool). The backends it creates while one
// is alive share its context (and pool) when they ask for as many threads.
void register_cpu_backend(CpuBackendOptions options = {});

}  // namespace pagoda::cpu
