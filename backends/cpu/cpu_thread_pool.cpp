#include "backends/cpu/cpu_thread_pool.h"

namespace pagoda::cpu {

ThreadPool& cpu_thread_pool() {
  // Never destroyed: an engine thread still computing while static destructors run at exit
  // must not find its workers joined and gone. The idle workers end with the process.
  static ThreadPool* pool = new ThreadPool();
  return *pool;
}

}  // namespace pagoda::cpu
