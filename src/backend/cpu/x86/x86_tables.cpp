// The x86-64 kernel tables (cpu_backend.h's arch_kernel_tables()): which SIMD kernels of x86/
// each puts over the reference ones, and the CPU features they need.
#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/x86/x86_kernels.h"

namespace pagoda::cpu {

namespace {

bool has_avx2_fma_f16c(const CpuFeatures& f) { return f.has("avx2") && f.has("fma") && f.has("f16c"); }

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

bool has_avxvnni(const CpuFeatures& f) { return has_avx2_fma_f16c(f) && f.has("avxvnni"); }

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
  return has_avx2_fma_f16c(f) && f.has("avx512f") && f.has("avx512bw") && f.has("avx512vl") && f.has("avx512vnni");
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
bool has_avx512(const CpuFeatures& f) { return has_avx2_fma_f16c(f) && f.has("avx512f") && f.has("avx512bw"); }

void install_avx512(KernelTable* k) {
  install_avx2(k);
  k->matmul = matmul_avx512;
  k->matmul_many = matmul_avx512_many;
  k->matmul_grouped = matmul_avx512_grouped;
  k->paged_attention = paged_attention_avx512;
}

bool has_avx512bf16(const CpuFeatures& f) { return has_avx512vnni(f) && f.has("avx512bf16"); }

void install_avx512bf16(KernelTable* k) {
  install_avx512vnni(k);
  k->matmul = matmul_avx512bf16;
  k->pack_matmul_weight = pack_matmul_weight_avx512bf16;
  k->matmul_many = matmul_avx512bf16_many;
  k->matmul_grouped = matmul_avx512bf16_grouped;
}

// The x86 kernel tables, best first (PAGODA_CPU_ISA names them). avx512bf16: the avx512vnni kernels
// with f16 and bf16 weights on vdpbf16ps (inputs, and f16 weights, rounded to bf16). avx512vnni:
// the AVX2 kernels with the integer matmul and the batched q8_0 / q4_x / q5_x products on 512-bit
// AVX-512 VNNI, the other block-type products on its 256-bit form (AVX-512 VL; no AVX-VNNI
// needed); avx512: the AVX2 kernels with the batched f32 / f16 / bf16 products on 512-bit FMAs
// (AVX-512 F and BW, no VNNI: Skylake-SP); avxvnni: the AVX2 kernels with the block-type and
// integer matmuls on AVX-VNNI; avx2: the AVX2 kernels.
constexpr CpuKernelTable kKernelTables[] = {
    {"avx512bf16", "avx2 fma f16c avx512f avx512bw avx512vl avx512vnni avx512bf16", has_avx512bf16,
     install_avx512bf16,
     "avx512bf16 f16 / bf16 matmul (inputs and f16 weights rounded to bf16); avx512vnni matmul_int and batched q8_0 "
     "/ q4_x / q5_x matmul; avx512 batched f32 matmul; avx512vl+vnni 256-bit matmul (decode, the K-quants; f32 "
     "decode avx2); avx512 attention (GQA groups of 4+; avx2 below); avx2+fma+f16c rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
    {"avx512vnni", "avx2 fma f16c avx512f avx512bw avx512vl avx512vnni", has_avx512vnni,
     install_avx512vnni,
     "avx512vnni matmul_int and batched q8_0 / q4_x / q5_x matmul; avx512 batched f32 / f16 / bf16 matmul; "
     "avx512vl+vnni 256-bit matmul (decode, the K-quants; f32 / f16 / bf16 decode avx2); avx512 attention (GQA "
     "groups of 4+; avx2 below); avx2+fma+f16c rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
    {"avx512", "avx2 fma f16c avx512f avx512bw", has_avx512, install_avx512,
     "avx512 batched f32 / f16 / bf16 matmul and attention (GQA groups of 4+); avx2+fma+f16c matmul (decode, "
     "every block type) and matmul_int, attention (smaller groups), rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
    {"avxvnni", "avx2 fma f16c avxvnni", has_avxvnni, install_avxvnni,
     "avxvnni matmul (every block type; f32 / f16 / bf16 avx2) and matmul_int; avx2+fma+f16c attention, rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
    {"avx2", "avx2 fma f16c", has_avx2_fma_f16c, install_avx2,
     "avx2+fma+f16c matmul and matmul_int (packed weights), attention, rms_norm, silu_mul, add",
     "embedding, rope, store_kv"},
};

}  // namespace

std::span<const CpuKernelTable> arch_kernel_tables() { return kKernelTables; }

}  // namespace pagoda::cpu
