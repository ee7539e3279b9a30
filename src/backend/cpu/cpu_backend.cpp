#include "backend/cpu/cpu_backend.h"

#include <mutex>

#include "backend/cpu/cpu_features.h"
#include "backend/cpu/cpu_thread_pool.h"
#include "backend/cpu/scalar/reference_kernels.h"

namespace pagoda::cpu {

std::span<const CpuKernelTable> cpu_kernel_tables() { return arch_kernel_tables(); }

const CpuKernelTable* find_cpu_kernel_table(std::string_view name) {
  for (const CpuKernelTable& t : cpu_kernel_tables()) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

Result<std::string> parse_cpu_isa(std::string_view name) {
  if (name.empty()) return std::string("auto");
  if (name == "auto" || name == "scalar" || find_cpu_kernel_table(name) != nullptr) return std::string(name);
  std::string names = "auto";
  for (const CpuKernelTable& t : cpu_kernel_tables()) names += ", " + std::string(t.name);
  return invalid_argument("unknown CPU ISA '" + std::string(name) + "' (" + names + " or scalar)");
}

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(CpuBackendOptions options,
                                                       std::shared_ptr<const CpuContext> context) {
  const CpuFeatures& f = cpu_features();
  KernelTable k = reference_kernels();
  if (!context) context = std::make_shared<const CpuContext>(options.threads > 0 ? options.threads : physical_cores());
  if (options.isa == "scalar") {
    return std::unique_ptr<CpuBackend>(new CpuBackend(k, context, "reference kernels (forced)"));
  }
  const bool best = options.isa.empty() || options.isa == "auto";
  for (const CpuKernelTable& table : cpu_kernel_tables()) {
    if (!best && options.isa != table.name) continue;
    if (!table.supported(f)) {
      if (!best) {
        return invalid_argument("the " + std::string(table.name) + " kernels need " + std::string(table.needs) +
                                "; this CPU has: " + f.to_string());
      }
      continue;
    }
    table.install(&k);
    std::string picked = std::string(table.replaced) + " on " + std::to_string(context->pool().num_threads()) +
                         " threads; " + std::string(table.kept) + " reference";
    return std::unique_ptr<CpuBackend>(new CpuBackend(k, context, std::move(picked)));
  }
  if (!best) return invalid_argument("no kernel table for that CPU ISA is compiled in");
  return std::unique_ptr<CpuBackend>(new CpuBackend(k, context, "reference kernels"));
}

std::string CpuBackend::description() const {
  return "cpu: " + picked_ + " (cpu features: " + cpu_features().to_string() + ")";
}

// Both tables multiply every dense DType of the traits table: the reference through its row
// decoders and chunk decoders, the AVX2 matmul through its panels (decoded chunks for the block
// types without a panel layout of their own). i8 codes go through matmul_int with their scales.
bool CpuBackend::supports_weight_type(DType t) const { return dtype_traits(t).dense_matmul; }

Kernels cpu_kernels(const KernelTable& table, int threads) {
  return Kernels(table, std::make_shared<const CpuContext>(threads));
}

void register_cpu_backend(CpuBackendOptions options) {
  // The context of the backends alive, shared by the next one that asks for as many threads.
  auto last = std::make_shared<std::weak_ptr<const CpuContext>>();
  auto mu = std::make_shared<std::mutex>();
  register_backend("cpu", [options, last, mu](const BackendOptions& asked) -> Result<std::unique_ptr<Backend>> {
    CpuBackendOptions o = options;
    if (asked.threads > 0) o.threads = asked.threads;
    const int threads = o.threads > 0 ? o.threads : physical_cores();
    std::lock_guard<std::mutex> lock(*mu);
    std::shared_ptr<const CpuContext> context = last->lock();
    if (!context || context->pool().num_threads() != threads) context = std::make_shared<const CpuContext>(threads);
    *last = context;
    PAGODA_ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> b, CpuBackend::create(o, context));
    return std::unique_ptr<Backend>(std::move(b));
  });
}

}  // namespace pagoda::cpu
