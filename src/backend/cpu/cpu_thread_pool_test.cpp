// The CPU backend's cores and pool: the cores this process may use, and the pool its context owns
// (its default size and --threads).
#include "backend/cpu/cpu_thread_pool.h"

#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "backend/cpu/cpu_backend.h"

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

// The pool is the backend's (its context's), of --threads threads (default: the physical cores);
// the backends one registration creates while one is alive share its context when they ask for as
// many threads, and another count gets a pool of its own.
TEST(CpuThreadPool, TheBackendsContextOwnsAPoolOfTheThreadsAsked) {
  register_cpu_backend();
  auto a = create_backend("cpu", BackendOptions{3});
  auto b = create_backend("cpu", BackendOptions{3});
  auto c = create_backend("cpu", BackendOptions{2});
  auto d = create_backend("cpu");
  ASSERT_TRUE(a.ok() && b.ok() && c.ok() && d.ok());
  ThreadPool& pa = pool_of((*a)->kernels().context());
  EXPECT_EQ(pa.num_threads(), 3);
  EXPECT_EQ(&pool_of((*b)->kernels().context()), &pa);
  EXPECT_EQ(pool_of((*c)->kernels().context()).num_threads(), 2);
  EXPECT_EQ(pool_of((*d)->kernels().context()).num_threads(), physical_cores());
  // A model's copy of the kernels keeps the context (and its pool) after the backend is gone.
  const Kernels kept = (*c)->kernels();
  c->reset();
  EXPECT_EQ(pool_of(kept.context()).num_threads(), 2);
}

}  // namespace
}  // namespace pagoda::cpu
