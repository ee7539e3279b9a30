// ThreadPool: a fixed set of worker threads that run data-parallel loops for the calling thread.
//
// Built for compute kernels called from one engine thread: parallel_for splits [0, n) into one
// contiguous range per thread (the caller is one of them), runs them, and returns when all are
// done. Between calls a worker first spins on the job counter for a short while (kSpinFor) and
// then sleeps on a condition variable; the caller likewise spins before it sleeps waiting for the
// last range. A decode step issues hundreds of short loops back to back, and a sleeping thread
// can take as long to wake (tens to hundreds of microseconds, more in a VM) as one of them takes
// to run: then the caller ran every range itself. Thread-safe: concurrent callers are
// served one after another (call_mutex_); a parallel_for issued from inside a running range (by a
// worker or the caller) runs inline instead of deadlocking.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace pagoda {

class ThreadPool {
 public:
  // How long an idle worker, or a caller waiting for the last range, polls before it sleeps.
  static constexpr std::chrono::microseconds kSpinFor{200};

  // A pool of `num_threads` threads counting the caller, so it starts num_threads - 1 workers.
  // num_threads <= 0 means std::thread::hardware_concurrency() (at least 1).
  explicit ThreadPool(int num_threads = 0);
  // Stops and joins the workers. No parallel_for may be running.
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Threads that share the work of one parallel_for, the caller included.
  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) over contiguous, disjoint ranges that cover [0, n) exactly, at most one
  // range per thread, and blocks until every call has returned. n <= 0 does nothing; n == 1 or a
  // one-thread pool runs fn(0, n) on the caller. fn must not throw (a throw on a worker ends the
  // process) and must be safe to call concurrently on disjoint ranges.
  void parallel_for(int64_t n, const std::function<void(int64_t begin, int64_t end)>& fn);

 private:
  void worker_loop();
  // Polls until done() or kSpinFor has passed (pausing, and yielding the core now and then so a
  // thread it would hold up can run). Returns done().
  template <typename Done>
  static bool spin_until(const Done& done);
  // Claims and runs ranges of job `generation` until none is left. Returns when this thread can
  // claim no more (others may still be running theirs).
  void run_ranges(uint32_t generation, const std::function<void(int64_t, int64_t)>* fn, int64_t n,
                  int64_t num_ranges);

  std::mutex call_mutex_;  // held by the caller for the whole of one parallel_for

  std::mutex mutex_;  // guards the job description below and stop_; pairs with both cvs
  std::condition_variable work_cv_;                            // a new job was published (or stop_)
  std::condition_variable done_cv_;                            // pending_ dropped to 0
  uint32_t generation_ = 0;                                    // bumped per job
  std::atomic<uint32_t> published_{0};  // generation_, for workers polling without the mutex
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;  // borrowed from the caller
  int64_t n_ = 0;
  int64_t num_ranges_ = 0;
  bool stop_ = false;

  // (generation << 32) | index of the next unclaimed range. Tagging claims with the generation
  // keeps a worker that woke late for an old job from claiming a range of the next one.
  std::atomic<uint64_t> next_claim_{0};
  std::atomic<int64_t> pending_{0};  // ranges of the current job not yet finished

  std::vector<std::thread> workers_;
};

}  // namespace pagoda
