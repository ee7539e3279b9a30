// Every SIMD kernel table compiled into the binary (cpu_kernel_tables()) is tested: each Kernels
// entry it replaces has a PAGODA_KERNEL_TABLE_TEST in this binary (of that table, or of another
// that installs the very same function there), on every machine, whatever its CPU; so a new table, or a new entry in one, cannot ship without a test, and on a CPU that
// has the table's instructions those tests run (they may skip only where the CPU lacks them).
// Also: CpuBackend picks each table exactly where the CPU supports it.
#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "backend/cpu/kernel_table_test_support.h"
#include "backend/cpu/scalar/reference_kernels.h"

namespace pagoda::cpu {
namespace kernel_table_testing {

namespace {
std::vector<KernelTableTest>& registry() {
  static std::vector<KernelTableTest> tests;
  return tests;
}
}  // namespace

bool register_kernel_table_test(const char* test, const char* table, const char* entries) {
  KernelTableTest t{test, table, {}};
  std::istringstream in(entries);
  for (std::string entry; in >> entry;) t.entries.push_back(entry);
  registry().push_back(std::move(t));
  return true;
}

const std::vector<KernelTableTest>& kernel_table_tests() { return registry(); }

}  // namespace kernel_table_testing

namespace {

using kernel_table_testing::kernel_table_tests;
using kernel_table_testing::KernelTableTest;

// Every entry of KernelTable, and whether two tables differ in it.
struct Entry {
  std::string_view name;
  bool (*differs)(const KernelTable& a, const KernelTable& b);
};
#define PAGODA_KERNELS_ENTRY(member) \
  Entry { #member, [](const KernelTable& a, const KernelTable& b) { return a.member != b.member; } }
constexpr Entry kEntries[] = {
    PAGODA_KERNELS_ENTRY(matmul),         PAGODA_KERNELS_ENTRY(pack_matmul_weight), PAGODA_KERNELS_ENTRY(matmul_many),
    PAGODA_KERNELS_ENTRY(matmul_grouped), PAGODA_KERNELS_ENTRY(matmul_int),         PAGODA_KERNELS_ENTRY(pack_int_weight),
    PAGODA_KERNELS_ENTRY(embedding),      PAGODA_KERNELS_ENTRY(rms_norm),           PAGODA_KERNELS_ENTRY(rope),
    PAGODA_KERNELS_ENTRY(silu_mul),       PAGODA_KERNELS_ENTRY(add),                PAGODA_KERNELS_ENTRY(store_kv),
    PAGODA_KERNELS_ENTRY(paged_attention), PAGODA_KERNELS_ENTRY(merge_attention),  PAGODA_KERNELS_ENTRY(copy_to_device),
    PAGODA_KERNELS_ENTRY(copy_to_host),
    PAGODA_KERNELS_ENTRY(zero),           PAGODA_KERNELS_ENTRY(upload),             PAGODA_KERNELS_ENTRY(copy_rows),
    PAGODA_KERNELS_ENTRY(gather_rows),    PAGODA_KERNELS_ENTRY(gather_columns),     PAGODA_KERNELS_ENTRY(moe_route),
    PAGODA_KERNELS_ENTRY(moe_combine),    PAGODA_KERNELS_ENTRY(all_reduce),         PAGODA_KERNELS_ENTRY(all_gather),
};
#undef PAGODA_KERNELS_ENTRY
// KernelTable holds only function pointers: a new one must be listed above, or a table could
// replace it untested.
static_assert(sizeof(KernelTable) == std::size(kEntries) * sizeof(void (*)()),
              "list the new KernelTable entry in kEntries");

// The entries `table` replaces.
std::vector<std::string> replaced_entries(const CpuKernelTable& table) {
  KernelTable k = reference_kernels();
  table.install(&k);
  std::vector<std::string> names;
  for (const Entry& e : kEntries) {
    if (e.differs(k, reference_kernels())) names.emplace_back(e.name);
  }
  return names;
}

// Whether tables a and b put the same function in Kernels::`entry`: a test of that entry in one
// tests it in the other (the avxvnni table keeps the avx2 table's kernels but matmul_int).
bool same_kernel(const CpuKernelTable& a, const CpuKernelTable& b, std::string_view entry) {
  KernelTable ka = reference_kernels(), kb = reference_kernels();
  a.install(&ka);
  b.install(&kb);
  for (const Entry& e : kEntries) {
    if (e.name == entry) return !e.differs(ka, kb);
  }
  return false;
}

bool is_registered_with_gtest(const std::string& full_name, bool* disabled) {
  const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit.total_test_suite_count(); ++i) {
    const ::testing::TestSuite& suite = *unit.GetTestSuite(i);
    for (int j = 0; j < suite.total_test_count(); ++j) {
      const ::testing::TestInfo& info = *suite.GetTestInfo(j);
      if (std::string(info.test_suite_name()) + "." + info.name() == full_name) {
        *disabled = std::string_view(info.test_suite_name()).starts_with("DISABLED_") ||
                    std::string_view(info.name()).starts_with("DISABLED_");
        return true;
      }
    }
  }
  return false;
}

TEST(CpuKernelTables, EveryEntryOfEveryCompiledTableHasAnEnabledTest) {
  ASSERT_FALSE(cpu_kernel_tables().empty()) << "the x86 build has an AVX2 table";
  const CpuFeatures& f = cpu_features();
  for (const CpuKernelTable& table : cpu_kernel_tables()) {
    const std::vector<std::string> replaced = replaced_entries(table);
    EXPECT_FALSE(replaced.empty()) << table.name << " replaces no reference kernel";
    for (const std::string& entry : replaced) {
      int tests = 0;
      for (const KernelTableTest& t : kernel_table_tests()) {
        if (std::find(t.entries.begin(), t.entries.end(), entry) == t.entries.end()) continue;
        const CpuKernelTable* tested = find_cpu_kernel_table(t.table);
        if (t.table != table.name && (tested == nullptr || !same_kernel(*tested, table, entry))) continue;
        bool disabled = false;
        EXPECT_TRUE(is_registered_with_gtest(t.test, &disabled)) << t.test;
        EXPECT_FALSE(disabled) << t.test << " tests " << table.name << " " << entry << " but is disabled";
        tests += !disabled;
      }
      EXPECT_GT(tests, 0) << "kernel table " << table.name << " replaces Kernels::" << entry
                          << " but no PAGODA_KERNEL_TABLE_TEST(..., \"" << table.name << "\", \"" << entry
                          << "\") checks it" << (table.supported(f) ? " (and this CPU would run it)" : "");
    }
  }
}

// A test names only tables that exist and entries its table replaces (so a table that stops
// replacing an entry, or is renamed, does not leave tests that check nothing it does).
TEST(CpuKernelTables, EveryKernelTableTestNamesEntriesItsTableReplaces) {
  EXPECT_FALSE(kernel_table_tests().empty());
  for (const KernelTableTest& t : kernel_table_tests()) {
    const CpuKernelTable* table = find_cpu_kernel_table(t.table);
    ASSERT_NE(table, nullptr) << t.test << " names kernel table \"" << t.table << "\", which is not compiled in";
    EXPECT_FALSE(t.entries.empty()) << t.test;
    const std::vector<std::string> replaced = replaced_entries(*table);
    for (const std::string& entry : t.entries) {
      EXPECT_NE(std::find(replaced.begin(), replaced.end(), entry), replaced.end())
          << t.test << " names Kernels::" << entry << ", which table " << t.table << " does not replace";
    }
  }
}

// CpuBackend runs a table exactly where the CPU supports it: forced, it is that table's kernels
// or an error naming what is missing; by default, the first supported table in the list.
TEST(CpuKernelTables, BackendPicksEachTableExactlyWhereTheCpuSupportsIt) {
  const CpuFeatures& f = cpu_features();
  const CpuKernelTable* best = nullptr;
  for (const CpuKernelTable& table : cpu_kernel_tables()) {
    KernelTable want = reference_kernels();
    table.install(&want);
    auto forced = CpuBackend::create(CpuBackendOptions{.isa = std::string(table.name)});
    ASSERT_EQ(forced.ok(), table.supported(f)) << table.name << ": " << f.to_string();
    if (!forced.ok()) {
      EXPECT_NE(forced.status().message().find(std::string(table.needs)), std::string::npos)
          << forced.status().message();
      continue;
    }
    if (best == nullptr) best = &table;
    for (const Entry& e : kEntries) EXPECT_FALSE(e.differs((*forced)->kernels().table(), want)) << table.name << " " << e.name;
    EXPECT_NE((*forced)->description().find(std::string(table.name)), std::string::npos) << (*forced)->description();
  }
  auto dflt = CpuBackend::create();
  ASSERT_TRUE(dflt.ok());
  KernelTable want = reference_kernels();
  if (best != nullptr) best->install(&want);
  for (const Entry& e : kEntries) {
    EXPECT_FALSE(e.differs((*dflt)->kernels().table(), want)) << (best ? best->name : "reference") << " " << e.name;
  }
}

}  // namespace
}  // namespace pagoda::cpu
