#include "base/thread_pool.h"

#include <algorithm>

namespace pagoda {

namespace {
// The pool whose range this thread is running, if any: a nested parallel_for on the same pool
// must run inline (the caller holds call_mutex_, and workers are all busy).
thread_local const ThreadPool* t_running_pool = nullptr;

constexpr uint64_t kIndexMask = 0xffffffffu;

// One polling step: tells the core this is a spin loop (frees the sibling hardware thread's
// resources and avoids the memory-order flush on exit).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}
}  // namespace

template <typename Done>
bool ThreadPool::spin_until(const Done& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpinFor;
  for (uint32_t i = 1;; ++i) {
    if (done()) return true;
    cpu_relax();
    if (i % 64 == 0) {
      if (std::chrono::steady_clock::now() >= deadline) return done();
      // On an oversubscribed machine the thread this one waits for may need its core.
      if (i % 1024 == 0) std::this_thread::yield();
    }
  }
}

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = static_cast<int>(std::thread::hardware_concurrency());
  num_threads = std::max(num_threads, 1);
  workers_.reserve(static_cast<size_t>(num_threads - 1));
  for (int i = 1; i < num_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    published_.store(generation_ + 1, std::memory_order_release);  // wakes spinning workers too
  }
  work_cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  if (n == 1 || workers_.empty() || t_running_pool == this) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call(call_mutex_);
  // Ranges are capped at 2^32 - 1 by the claim encoding; threads are far fewer.
  const int64_t num_ranges = std::min<int64_t>(n, num_threads());
  uint32_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    generation = ++generation_;
    fn_ = &fn;
    n_ = n;
    num_ranges_ = num_ranges;
    pending_.store(num_ranges, std::memory_order_relaxed);
    next_claim_.store(static_cast<uint64_t>(generation) << 32, std::memory_order_release);
    published_.store(generation, std::memory_order_release);
  }
  work_cv_.notify_all();  // (no system call when every worker is spinning, not waiting)
  // The caller claims ranges like any worker, so a worker slow to wake never holds it up: its
  // range is simply taken by whoever gets there first.
  run_ranges(generation, &fn, n, num_ranges);
  if (spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) return;
  std::unique_lock<std::mutex> lock(mutex_);
  done_cv_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;  // generation_ starts at 0: no job yet
  for (;;) {
    uint32_t generation;
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t n, num_ranges;
    spin_until([&] { return published_.load(std::memory_order_acquire) != seen; });
    {
      // The job is read under the mutex whether it was seen spinning or after a wait.
      std::unique_lock<std::mutex> lock(mutex_);
      work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation = generation_;
      fn = fn_;
      n = n_;
      num_ranges = num_ranges_;
    }
    run_ranges(generation, fn, n, num_ranges);
  }
}

void ThreadPool::run_ranges(uint32_t generation, const std::function<void(int64_t, int64_t)>* fn,
                            int64_t n, int64_t num_ranges) {
  const ThreadPool* outer = t_running_pool;
  t_running_pool = this;
  const int64_t base = n / num_ranges, extra = n % num_ranges;
  uint64_t claim = next_claim_.load(std::memory_order_acquire);
  for (;;) {
    // A claim of another generation means this job is over (and its fn may be gone).
    if ((claim >> 32) != generation || static_cast<int64_t>(claim & kIndexMask) >= num_ranges)
      break;
    if (!next_claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel)) continue;
    const int64_t r = static_cast<int64_t>(claim & kIndexMask);
    const int64_t begin = r * base + std::min(r, extra);
    const int64_t end = begin + base + (r < extra ? 1 : 0);
    (*fn)(begin, end);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      // Taking the mutex orders this notify after the caller's check-then-sleep.
      std::lock_guard<std::mutex> lock(mutex_);
      done_cv_.notify_one();
    }
    claim = next_claim_.load(std::memory_order_acquire);
  }
  t_running_pool = outer;
}

}  // namespace pagoda
