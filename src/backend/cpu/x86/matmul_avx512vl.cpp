// The AVX-512 tables' Kernels::matmul leaf loops for the block types that stay on 256 bits
// (decode and the K-quants): matmul_avx2.cpp built again as for the avxvnni table, with the
// EVEX vpdpbusd of AVX-512 VNNI + VL in place of AVX-VNNI's VEX one, so that the AVX-512
// tables run on CPUs without AVX-VNNI (Zen 4, Ice Lake, Cascade Lake). Bit for bit the AVX2
// ones.
#define PAGODA_AVXVNNI 1
#define PAGODA_AVX512VL_VNNI 1
#include "backend/cpu/x86/matmul_avx2.cpp"
