#include "backends/cpu/cpu_thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>

namespace pagoda::cpu {
namespace {

std::mutex g_mutex;
int g_requested = 0;             // set_cpu_threads; 0 = physical_cores()
std::atomic<ThreadPool*> g_pool{nullptr};  // created once, never destroyed (see cpu_thread_pool)

int read_int(const std::string& path, int fallback) {
  std::ifstream in(path);
  int v;
  return in >> v ? v : fallback;
}

}  // namespace

int physical_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) != 0) {
    return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
  std::set<std::pair<int, int>> cores;  // (package, core) of every CPU we may run on
  int cpus = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    ++cpus;
    const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    // Without sysfs topology every CPU counts as its own core.
    cores.emplace(read_int(topo + "physical_package_id", 0), read_int(topo + "core_id", -1 - cpu));
  }
  return std::max<int>(1, static_cast<int>(cores.empty() ? cpus : cores.size()));
}

Status set_cpu_threads(int n) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (ThreadPool* pool = g_pool.load(std::memory_order_acquire)) {
    const int want = n > 0 ? n : physical_cores();
    if (pool->num_threads() == want) return Status::ok_status();
    return invalid_argument("the CPU thread pool already runs " +
                            std::to_string(pool->num_threads()) + " threads");
  }
  g_requested = n > 0 ? n : 0;
  return Status::ok_status();
}

ThreadPool& cpu_thread_pool() {
  if (ThreadPool* pool = g_pool.load(std::memory_order_acquire)) return *pool;  // every kernel call
  std::lock_guard<std::mutex> lock(g_mutex);
  // Never destroyed: an engine thread still computing while static destructors run at exit
  // must not find its workers joined and gone. The idle workers end with the process.
  if (g_pool.load(std::memory_order_relaxed) == nullptr) {
    g_pool.store(new ThreadPool(g_requested > 0 ? g_requested : physical_cores()),
                 std::memory_order_release);
  }
  return *g_pool.load(std::memory_order_relaxed);
}

}  // namespace pagoda::cpu
