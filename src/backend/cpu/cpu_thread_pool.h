// The CPU backend's worker threads: one ThreadPool per process, created on first use and shared by
// every CpuBackend. It is process-wide because Kernels entries are plain function pointers with no
// context argument; it is the only state the CPU kernels keep. Thread-safe (ThreadPool serializes
// concurrent parallel_for callers).
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

// Sets the pool's size (threads, the caller included) before its first use; n <= 0 keeps the
// default, physical_cores(). Fails once the pool exists with another size.
Status set_cpu_threads(int n);

// The shared pool (created on the first call; lives until the process exits).
ThreadPool& cpu_thread_pool();

}  // namespace pagoda::cpu
