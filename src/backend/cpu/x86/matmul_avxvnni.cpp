// The avxvnni table's Kernels::matmul leaf loops for the block types (q8_0, the nibble types and
// the K-quants): matmul_avx2.cpp built again with -mavxvnni, their 4-byte groups on vpdpbusd
// (that file says how). Bit for bit the AVX2 ones.
#define PAGODA_AVXVNNI 1
#include "backend/cpu/x86/matmul_avx2.cpp"
