// ShmCommunicator with real rank processes: this test process is rank 0 and forks the others
// after mapping the region, as `--distributed-executor-backend mp` will. The collectives meet
// tests/support/communicator_checks.h at 2, 3 and 4 ranks (the sums the same bits on every rank);
// a rank that exits, leaves, aborts or hangs makes the others' next call fail, naming it, well
// before the wait's timeout (or at it, for the hung one).
#include "comm/shm/shm_communicator.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <functional>
#include <thread>

#include "support/communicator_checks.h"

namespace pagoda::shm {
namespace {

using std::chrono::milliseconds;

// Forks ranks 1 .. n-1, each running `child` on its communicator and exiting with its result (0
// = pass); returns their pids. The caller is rank 0.
std::vector<pid_t> fork_ranks(const std::shared_ptr<ShmRegion>& region, const std::function<int(ShmCommunicator&)>& child,
                              milliseconds timeout = std::chrono::seconds(60)) {
  std::vector<pid_t> pids;
  for (int r = 1; r < region->num_ranks(); ++r) {
    const pid_t pid = fork();
    if (pid == 0) {
      int code;
      {
        ShmCommunicator c(region, r, timeout);
        code = child(c);
      }
      std::fflush(stderr);
      _exit(code);
    }
    pids.push_back(pid);
  }
  return pids;
}

// Each child's exit status (its code, or 128 + the signal that ended it).
std::vector<int> reap(const std::vector<pid_t>& pids) {
  std::vector<int> codes;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    codes.push_back(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  return codes;
}

TEST(ShmCommunicator, CollectivesAtTwoThreeAndFourRanks) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(std::to_string(n) + " ranks");
    auto region = ShmRegion::create(n);
    ASSERT_TRUE(region.ok()) << region.status().message();
    auto pids = fork_ranks(*region, [](ShmCommunicator& c) {
      const std::string problem = testing::check_collectives(c, true);
      if (!problem.empty()) std::fprintf(stderr, "%s\n", problem.c_str());
      return problem.empty() ? 0 : 1;
    });
    std::string problem;
    {
      ShmCommunicator c(*region, 0);
      problem = testing::check_collectives(c, true);
    }
    EXPECT_EQ(problem, "");
    for (int code : reap(pids)) EXPECT_EQ(code, 0);
  }
}

// A rank process that dies (here: exits without a word) is noticed by its peers' next wait within
// a poll interval or two, though the wait's timeout is a minute.
TEST(ShmCommunicator, ADeadRankFailsThePeersCallsNamingIt) {
  auto region = ShmRegion::create(3);
  ASSERT_TRUE(region.ok());
  auto pids = fork_ranks(*region, [](ShmCommunicator& c) {
    if (c.rank() == 2) _exit(7);  // dies before the barrier, its pid still registered
    Status s = c.barrier();
    std::this_thread::sleep_for(std::chrono::seconds(1));  // still in the group when rank 0 looks
    return s.ok() ? 0 : (s.message().find("rank 2 (pid") != std::string::npos ? 3 : 1);
  });
  ShmCommunicator c(*region, 0);
  const auto start = std::chrono::steady_clock::now();
  Status s = c.barrier();
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("rank 2 (pid " + std::to_string(pids[1]) + ") has exited"), std::string::npos) << s.message();
  EXPECT_LT(waited, 5.0);
  // The group stays failed: nothing waits again.
  EXPECT_FALSE(c.barrier().ok());
  EXPECT_FALSE(c.send("x", 1, 1).ok());
  EXPECT_EQ(reap(pids), (std::vector<int>{3, 7}));
}

TEST(ShmCommunicator, LeavingAndAbortingRanksAreNamed) {
  {  // Rank 1 destroys its communicator: it has left.
    auto region = ShmRegion::create(2);
    ASSERT_TRUE(region.ok());
    ShmCommunicator c(*region, 0);
    auto pids = fork_ranks(*region, [](ShmCommunicator&) { return 0; });
    EXPECT_EQ(reap(pids), std::vector<int>{0});
    Status s = c.recv(nullptr, 0, 1);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("rank 1 has left the group"), std::string::npos) << s.message();
  }
  {  // Rank 1 aborts the group while rank 0 waits for a message from it.
    auto region = ShmRegion::create(2);
    ASSERT_TRUE(region.ok());
    ShmCommunicator c(*region, 0);
    auto pids = fork_ranks(*region, [](ShmCommunicator& mine) {
      mine.abort();
      std::this_thread::sleep_for(milliseconds(500));  // still alive when rank 0 looks
      return 0;
    });
    float x = 0;
    Status s = c.recv(&x, sizeof x, 1);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("rank 1 aborted the group"), std::string::npos) << s.message();
    EXPECT_EQ(reap(pids), std::vector<int>{0});
  }
}

// A rank that is alive but never answers: the wait ends at its timeout.
TEST(ShmCommunicator, AHungRankTimesOut) {
  auto region = ShmRegion::create(2);
  ASSERT_TRUE(region.ok());
  auto pids = fork_ranks(*region, [](ShmCommunicator&) {
    std::this_thread::sleep_for(std::chrono::seconds(30));
    return 0;
  });
  ShmCommunicator c(*region, 0, milliseconds(300));
  std::vector<float> data(10, 1.0f);
  const auto start = std::chrono::steady_clock::now();
  Status s = c.all_reduce_sum(data.data(), 10);
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no answer within 300 ms"), std::string::npos) << s.message();
  EXPECT_GE(waited, 0.3);
  EXPECT_LT(waited, 5.0);
  kill(pids[0], SIGKILL);
  EXPECT_EQ(reap(pids), std::vector<int>{128 + SIGKILL});
}

TEST(ShmCommunicator, BadGroupsAreRefused) {
  EXPECT_EQ(ShmRegion::create(0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::create(300).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ShmRegion::create(2, 100).status().code(), StatusCode::kInvalidArgument);
  auto region = ShmRegion::create(2, 4096);
  ASSERT_TRUE(region.ok());
  ShmCommunicator c(*region, 0);
  EXPECT_EQ(c.send("x", 1, 0).code(), StatusCode::kInvalidArgument);  // to itself
  EXPECT_EQ(c.recv(nullptr, 0, 5).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.broadcast(nullptr, 0, 2).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pagoda::shm
