#include "base/memory_info.h"

#include <unistd.h>

#include <cstdio>
#include <initializer_list>

namespace pagoda {

int64_t available_memory_bytes() {
  long pages = sysconf(_SC_AVPHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : (int64_t{1} << 32);
}

int64_t total_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  int64_t total = pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : (int64_t{1} << 32);
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    if (FILE* f = std::fopen(path, "r")) {
      long long limit = 0;
      if (std::fscanf(f, "%lld", &limit) == 1 && limit > 0 && limit < total) total = limit;
      std::fclose(f);
    }
  }
  return total;
}

}  // namespace pagoda
