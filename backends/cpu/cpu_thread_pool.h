// The CPU backend's worker threads: one ThreadPool per process, with
// std::thread::hardware_concurrency() threads, created on first use and shared by every
// CpuBackend. It is process-wide because Kernels entries are plain function pointers with no
// context argument; it is the only state the CPU kernels keep. Thread-safe (ThreadPool serializes
// concurrent parallel_for callers).
#pragma once

#include "base/thread_pool.h"

namespace pagoda::cpu {

// The shared pool (created on the first call; lives until the process exits).
ThreadPool& cpu_thread_pool();

}  // namespace pagoda::cpu
