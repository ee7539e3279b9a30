// The CPU backend's shared pool: its default size and --threads, in a process of its own (the
// pool is created once per process, so no other test may touch it first).
#include "backends/cpu/cpu_thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

namespace pagoda::cpu {
namespace {

TEST(CpuThreadPool, PhysicalCoresIsBetweenOneAndTheHardwareThreads) {
  const int cores = physical_cores();
  EXPECT_GE(cores, 1);
  EXPECT_LE(cores, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
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
