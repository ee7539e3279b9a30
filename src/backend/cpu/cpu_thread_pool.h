// The CPU cores this process may run on, which size the CPU backend's thread pool (its
// CpuContext, cpu_backend.h, owns the pool). Thread-safe.
#pragma once

#include <vector>

#include "base/status.h"
#include "base/thread_pool.h"

namespace pagoda::cpu {

// A physical core this process may run on: its NUMA node and its CPUs (SMT siblings).
struct CpuCore {
  int numa_node = 0;
  std::vector<int> cpus;
};
// Every core of this process's CPU affinity, by NUMA node, then package, then core id (sysfs
// topology; without it every CPU is a core of its own). Empty when the affinity is unreadable.
std::vector<CpuCore> allowed_cores();

// Physical cores this process may run on (its CPU affinity, SMT siblings counted once; at least
// 1). The default size of the pool: a second hardware thread on a core adds no FMA or load units
// to a kernel that already keeps them busy.
int physical_cores();


}  // namespace pagoda::cpu
