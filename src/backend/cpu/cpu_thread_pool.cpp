#include "backend/cpu/cpu_thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <utility>

namespace pagoda::cpu {
namespace {

int read_int(const std::string& path, int fallback) {
  std::ifstream in(path);
  int v;
  return in >> v ? v : fallback;
}

// The NUMA node of `cpu`: the nodeN entry in its sysfs folder; 0 without one.
int numa_node_of(int cpu) {
  std::error_code ec;
  const std::filesystem::path dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu);
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name.size() > 4 && name.compare(0, 4, "node") == 0 &&
        std::all_of(name.begin() + 4, name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
      return std::stoi(name.substr(4));
    }
  }
  return 0;
}

}  // namespace

std::vector<CpuCore> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<CpuCore> cores;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return cores;
  std::map<std::tuple<int, int, int>, std::vector<int>> by_core;  // (node, package, core) -> CPUs
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    const std::string topo = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    // Without sysfs topology every CPU counts as its own core.
    by_core[{numa_node_of(cpu), read_int(topo + "physical_package_id", 0), read_int(topo + "core_id", -1 - cpu)}]
        .push_back(cpu);
  }
  for (auto& [key, cpus] : by_core) cores.push_back(CpuCore{std::get<0>(key), std::move(cpus)});
  return cores;
}

int physical_cores() {
  const size_t cores = allowed_cores().size();
  if (cores == 0) return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return static_cast<int>(cores);
}

}  // namespace pagoda::cpu
