// The CPU backend's shared pool: its default size and --threads, in a process of its own (the
// pool is created once per process, so no other test may touch it first).
#include "backend/cpu/cpu_thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <thread>

namespace pagoda::cpu {
namespace {

TEST(CpuThreadPool, PhysicalCoresIsBetweenOneAndTheHardwareThreads) {
  const int cores = physical_cores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

// Every CPU of the affinity in exactly one core, the cores in NUMA node order; as many cores as
// physical_cores() says.
TEST(CpuThreadPool, AllowedCoresCoverTheAffinityOnceInNodeOrder) {
  cpu_set_t set;
  CPU_ZERO(&set);
  ASSERT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  const std::vector<CpuCore> cores = allowed_cores();
  ASSERT_FALSE(cores.empty());
  EXPECT_EQ(static_cast<int>(cores.size()), physical_cores());
  std::vector<int> seen;
  for (size_t i = 0; i < cores.size(); ++i) {
    EXPECT_FALSE(cores[i].cpus.empty());
    if (i > 0) {
      EXPECT_LE(cores[i - 1].numa_node, cores[i].numa_node);
    }
    for (int cpu : cores[i].cpus) {
      EXPECT_TRUE(CPU_ISSET(cpu, &set)) << cpu;
      seen.push_back(cpu);
    }
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end());
  EXPECT_EQ(static_cast<int>(seen.size()), CPU_COUNT(&set));
}

TEST(CpuThreadPool, SizeIsSetBeforeFirstUseAndFixedAfter) {
  ASSERT_TRUE(set_cpu_threads(3).ok());
  ASSERT_TRUE(set_cpu_threads(5).ok());  // not created yet: the last request wins
  EXPECT_EQ(cpu_thread_pool().num_threads(), 5);
  EXPECT_EQ(&cpu_thread_pool(), &cpu_thread_pool());
  EXPECT_TRUE(set_cpu_threads(5).ok());  // the size it has
  Status other = set_cpu_threads(2);
  ASSERT_FALSE(other.ok());
  EXPECT_NE(other.message().find("5 threads"), std::string::npos) << other.message();
}

}  // namespace
}  // namespace pagoda::cpu
