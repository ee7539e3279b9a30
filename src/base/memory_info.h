// The machine's memory as this process sees it, for sizing decisions made before allocating
// (the KV cache's share of memory, whether a model's dummy weights can fit). Thread-safe.
#pragma once

#include <cstdint>

namespace pagoda {

// Physical memory, or the cgroup's limit (v2 memory.max, v1 memory.limit_in_bytes) where that
// is lower; 4 GiB where the system does not say.
int64_t total_memory_bytes();

// Physical memory not in use now (the kernel's free pages); 4 GiB where the system does not say.
int64_t available_memory_bytes();

}  // namespace pagoda
