// The avxvnni table's Kernels::matmul_int leaf loops: int_matmul_avx2.cpp built again with
// -mavxvnni, its 4-column steps on vpdpbusd (that file says how). Bit for bit the AVX2 ones.
#define PAGODA_AVXVNNI 1
#include "backend/cpu/x86/int_matmul_avx2.cpp"
