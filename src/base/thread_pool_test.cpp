#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

namespace pagoda {
namespace {

// Runs parallel_for(n) and returns the ranges it was called with, sorted.
std::vector<std::pair<int64_t, int64_t>> ranges_of(ThreadPool& pool, int64_t n) {
  std::mutex mu;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  pool.parallel_for(n, [&](int64_t b, int64_t e) {
    std::lock_guard<std::mutex> lock(mu);
    ranges.emplace_back(b, e);
  });
  std::sort(ranges.begin(), ranges.end());
  return ranges;
}

TEST(ThreadPool, DefaultSizeIsHardwareConcurrency) {
  ThreadPool pool;
  EXPECT_EQ(pool.num_threads(), std::max(1, static_cast<int>(std::thread::hardware_concurrency())));
}

TEST(ThreadPool, RangesAreContiguousDisjointAndCover) {
  for (int threads : {1, 2, 3, 4, 8}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.num_threads(), threads);
    for (int64_t n : {0, 1, 2, 3, 5, 7, 8, 9, 100, 1001}) {
      auto ranges = ranges_of(pool, n);
      if (n == 0) {
        EXPECT_TRUE(ranges.empty());
        continue;
      }
      EXPECT_EQ(static_cast<int64_t>(ranges.size()), std::min<int64_t>(n, threads)) << n;
      int64_t next = 0;
      for (auto [b, e] : ranges) {
        EXPECT_EQ(b, next) << "threads " << threads << " n " << n;
        EXPECT_LT(b, e);
        next = e;
      }
      EXPECT_EQ(next, n);
      // Balanced: sizes differ by at most one.
      int64_t lo = n, hi = 0;
      for (auto [b, e] : ranges) lo = std::min(lo, e - b), hi = std::max(hi, e - b);
      EXPECT_LE(hi - lo, 1);
    }
  }
}

TEST(ThreadPool, EveryElementVisitedOnceOverManyCalls) {
  ThreadPool pool(4);
  std::vector<int> hits(257);
  for (int call = 0; call < 2000; ++call) {
    const int64_t n = 1 + call % 257;
    pool.parallel_for(n, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) ++hits[static_cast<size_t>(i)];
    });
  }
  int64_t total = 0;
  for (int h : hits) total += h;
  int64_t want = 0;
  for (int call = 0; call < 2000; ++call) want += 1 + call % 257;
  EXPECT_EQ(total, want);
  // Element i is covered by every call with n > i.
  for (int i = 0; i < 257; ++i) {
    int64_t w = 0;
    for (int call = 0; call < 2000; ++call) w += (1 + call % 257) > i;
    ASSERT_EQ(hits[static_cast<size_t>(i)], w) << i;
  }
}

TEST(ThreadPool, UsesMoreThanOneThread) {
  ThreadPool pool(3);
  std::mutex mu;
  std::set<std::thread::id> ids;
  std::atomic<int> arrived{0};
  pool.parallel_for(3, [&](int64_t, int64_t) {
    {
      std::lock_guard<std::mutex> lock(mu);
      ids.insert(std::this_thread::get_id());
    }
    // Hold each range until all three started, so no thread can take two.
    ++arrived;
    while (arrived.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_TRUE(ids.count(std::this_thread::get_id()));  // the caller works too
}

TEST(ThreadPool, NestedCallRunsInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  pool.parallel_for(2, [&](int64_t b, int64_t e) {
    pool.parallel_for(10, [&](int64_t ib, int64_t ie) {
      for (int64_t i = ib; i < ie; ++i) sum += i;
    });
  });
  EXPECT_EQ(sum.load(), 2 * 45);
}

TEST(ThreadPool, ConcurrentCallersAreServedInTurn) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 200; ++rep) {
        pool.parallel_for(16, [&](int64_t b, int64_t e) { sum += e - b; });
      }
    });
  }
  for (auto& t : callers) t.join();
  EXPECT_EQ(sum.load(), 3 * 200 * 16);
}

}  // namespace
}  // namespace pagoda
