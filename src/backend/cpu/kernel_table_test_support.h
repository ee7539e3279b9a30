// Tests of the SIMD kernel tables (cpu_kernel_tables()): each names the table and the Kernels
// entries it checks, so that kernel_table_coverage_test.cpp, linked into the same binary, can
// check that every entry every compiled table replaces has a test. Such a test skips only where
// the CPU lacks the table's instructions; a skip anywhere else is a failure.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/testing_context.h"

namespace pagoda::cpu::kernel_table_testing {

struct KernelTableTest {
  std::string test;                  // "Suite.Name"
  std::string table;                 // a CpuKernelTable::name
  std::vector<std::string> entries;  // Kernels member names
};

// Records a test; `entries` is space-separated. Returns true (it initializes a static).
bool register_kernel_table_test(const char* test, const char* table, const char* entries);

// Every test recorded in this binary.
const std::vector<KernelTableTest>& kernel_table_tests();

// The CPU context for the tests that call a table's entries directly (testing_context.h).
inline const ExecContext& test_context() { return testing_context(); }

}  // namespace pagoda::cpu::kernel_table_testing

// PAGODA_KERNEL_TABLE_TEST(Suite, Name, "avx2", "matmul pack_matmul_weight") { body }: a test of
// the entries `entries` of kernel table `table`. It fails when no such table is compiled in,
// skips (saying so) where the CPU lacks the table's instructions, and fails when the body skips
// on a CPU that has them.
#define PAGODA_KERNEL_TABLE_TEST(suite, name, table, entries)                                                          \
  void suite##_##name##_KernelTableBody();                                                                             \
  [[maybe_unused]] const bool suite##_##name##_kernel_table_test =                                                     \
      ::pagoda::cpu::kernel_table_testing::register_kernel_table_test(#suite "." #name, table, entries);               \
  TEST(suite, name) {                                                                                                  \
    const ::pagoda::cpu::CpuKernelTable* kernel_table = ::pagoda::cpu::find_cpu_kernel_table(table);                   \
    ASSERT_NE(kernel_table, nullptr) << "no kernel table \"" << (table) << "\" is compiled in";                        \
    if (!kernel_table->supported(::pagoda::cpu::cpu_features())) {                                                     \
      GTEST_SKIP() << "the CPU lacks " << kernel_table->needs << " for the " << (table)                                \
                   << " kernels; it has: " << ::pagoda::cpu::cpu_features().to_string();                               \
    }                                                                                                                  \
    suite##_##name##_KernelTableBody();                                                                                \
    if (IsSkipped()) {                                                                                                 \
      ADD_FAILURE() << "skipped on a CPU that has " << kernel_table->needs << ": a test of the " << (table)            \
                    << " kernels may skip only where the CPU lacks their instructions";                                \
    }                                                                                                                  \
  }                                                                                                                    \
  void suite##_##name##_KernelTableBody()
