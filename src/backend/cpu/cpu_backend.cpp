#include "backend/cpu/cpu_backend.h"

#include "backend/cpu/cpu_features.h"
#include <mutex>

#include "backend/cpu/cpu_thread_pool.h"
#include "backend/cpu/scalar/reference_kernels.h"
#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {

Result<CpuIsa> parse_cpu_isa(std::string_view name) {
  if (name.empty() || name == "auto") return CpuIsa::kBest;
  if (name == "avx512bf16") return CpuIsa::kAvx512Bf16;
  if (name == "avx512vnni") return CpuIsa::kAvx512Vnni;
  if (name == "avx512") return CpuIsa::kAvx512;
  if (name == "avxvnni") return CpuIsa::kAvxVnni;
  if (name == "avx2") return CpuIsa::kAvx2;
  if (name == "scalar") return CpuIsa::kScalar;
  return invalid_argument("unknown CPU ISA '" + std::string(name) +
                          "' (auto, avx512bf16, avx512vnni, avx512, avxvnni, avx2 or scalar)");
}

namespace {

bool has_avx2_fma_f16c(const CpuFeatures& f) { return f.avx2 && f.fma && f.f16c; }

void install_avx2(KernelTable* k) {
  k->matmul = matmul_avx2;
  k->matmul_many = matmul_avx2_many;
  k->matmul_grouped = matmul_avx2_grouped;
  k->pack_matmul_weight = pack_matmul_weight_avx2;
  k->matmul_int = matmul_int_avx2;
  k->pack_int_weight = pack_int_weight_avx2;
  k->paged_attention = paged_attention_avx2;
  k->rms_norm = rms_norm_avx2;
  k->silu_mul = silu_mul_avx2;
  k->add = add_avx2;
}

bool has_avxvnni(const CpuFeatures& f) { return has_avx2_fma_f16c(f) && f.avxvnni; }

void install_avxvnni(KernelTable* k) {
  install_avx2(k);
  k->matmul = matmul_avxvnni;
  k->matmul_many = matmul_avxvnni_many;
  k->matmul_grouped = matmul_avxvnni_grouped;
  k->matmul_int = matmul_int_avxvnni;
}

// AVX-VNNI is not needed: the block types' 256-bit leaves take the EVEX vpdpbusd of AVX-512 VNNI
// + VL (Zen 4, Ice Lake and Cascade Lake have AVX-512 VNNI and not AVX-VNNI).
bool has_avx512vnni(const CpuFeatures& f) {
  return has_avx2_fma_f16c(f) && f.avx512f && f.avx512bw && f.avx512vl && f.avx512vnni;
}

void install_avx512vnni(KernelTable* k) {
  install_avx2(k);
  k->matmul = matmul_avx512vnni;
  k->matmul_many = matmul_avx512vnni_many;
  k->matmul_grouped = matmul_avx512vnni_grouped;
  k->matmul_int = matmul_int_avx512vnni;
  k->paged_attention = paged_attention_avx512;
}

// AVX-512 F and BW without VNNI (Skylake-SP / -X): the batched float products on 512-bit FMAs.
bool has_avx512(const CpuFeatures& f) { return has_avx2_fma_f16c(f) && f.avx512f && f.avx512bw; }

void install_avx512(KernelTable* k) {
  install_avx2(k);
  k->matmul = matmul_avx512;
  k->matmul_many = matmul_avx512_many;
  k->matmul_grouped = matmul_avx512_grouped;
  k->paged_attention = paged_attention_avx512;
}

bool has_avx512bf16(const CpuFeatures& f) { return has_avx512vnni(f) && f.avx512bf16; }

void install_avx512bf16(KernelTable* k) {
  install_avx512vnni(k);
  k->matmul = matmul_avx512bf16;
  k->pack_matmul_weight = pack_matmul_weight_avx512bf16;
  k->matmul_many = matmul_avx512bf16_many;
  k->matmul_grouped = matmul_avx512bf16_grouped;
}

constexpr CpuKernelTable kKernelTables[] = {
    {CpuIsa::kAvx512Bf16, "avx512bf16", "avx2 fma f16c avx512f avx512bw avx512vl avx512vnni avx512bf16", has_avx512bf16,
     install_avx512bf16,
     "avx512bf16 f16 / bf16 matmul (inputs and f16 weights rounded to bf16); avx512vnni matmul_int and batched q8_0 "
     "/ q4_x / q5_x matmul; avx512 batched f32 matmul; avx512vl+vnni 256-bit matmul (decode, the K-quants; f32 "
     "decode avx2); avx512 attention (GQA groups of 4+; avx2 below); avx2+fma+f16c rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
    {CpuIsa::kAvx512Vnni, "avx512vnni", "avx2 fma f16c avx512f avx512bw avx512vl avx512vnni", has_avx512vnni,
     install_avx512vnni,
     "avx512vnni matmul_int and batched q8_0 / q4_x / q5_x matmul; avx512 batched f32 / f16 / bf16 matmul; "
     "avx512vl+vnni 256-bit matmul (decode, the K-quants; f32 / f16 / bf16 decode avx2); avx512 attention (GQA "
     "groups of 4+; avx2 below); avx2+fma+f16c rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
    {CpuIsa::kAvx512, "avx512", "avx2 fma f16c avx512f avx512bw", has_avx512, install_avx512,
     "avx512 batched f32 / f16 / bf16 matmul and attention (GQA groups of 4+); avx2+fma+f16c matmul (decode, "
     "every block type) and matmul_int, attention (smaller groups), rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
    {CpuIsa::kAvxVnni, "avxvnni", "avx2 fma f16c avxvnni", has_avxvnni, install_avxvnni,
     "avxvnni matmul (every block type; f32 / f16 / bf16 avx2) and matmul_int; avx2+fma+f16c attention, rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
    {CpuIsa::kAvx2, "avx2", "avx2 fma f16c", has_avx2_fma_f16c, install_avx2,
     "avx2+fma+f16c matmul and matmul_int (packed weights), attention, rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
};

}  // namespace

std::span<const CpuKernelTable> cpu_kernel_tables() { return kKernelTables; }

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(CpuBackendOptions options,
                                                       std::shared_ptr<const CpuContext> context) {
  const CpuFeatures& f = cpu_features();
  KernelTable k = reference_kernels();
  if (!context) context = std::make_shared<const CpuContext>(options.threads > 0 ? options.threads : physical_cores());
  if (options.isa == CpuIsa::kScalar) {
    return std::unique_ptr<CpuBackend>(new CpuBackend(k, context, "reference kernels (forced)"));
  }
  for (const CpuKernelTable& table : cpu_kernel_tables()) {
    if (options.isa != CpuIsa::kBest && options.isa != table.isa) continue;
    if (!table.supported(f)) {
      if (options.isa == table.isa) {
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
  if (options.isa != CpuIsa::kBest) return invalid_argument("no kernel table for that CPU ISA is compiled in");
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
