// MpiCommunicator under mpirun (src/comm/mpi/CMakeLists.txt starts 2 and 4 ranks, and one process
// without mpirun): every rank runs this binary's tests; the collectives meet
// tests/support/communicator_checks.h.
#include "comm/mpi/mpi_communicator.h"

#include <gtest/gtest.h>

#include "support/communicator_checks.h"

namespace pagoda::mpi {
namespace {

TEST(MpiCommunicator, CollectivesMeetTheChecks) {
  auto world = MpiCommunicator::create_world();
  ASSERT_TRUE(world.ok()) << world.status().message();
  EXPECT_EQ(testing::check_collectives(**world, false), "");
  // A second communicator on the same world (MPI starts once per process).
  auto again = MpiCommunicator::create_world();
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ((*again)->rank(), (*world)->rank());
  EXPECT_EQ((*again)->size(), (*world)->size());
  EXPECT_TRUE((*again)->barrier().ok());
}

TEST(MpiCommunicator, ErrorsAreReturnedNotFatal) {
  auto world = MpiCommunicator::create_world();
  ASSERT_TRUE(world.ok());
  Communicator& c = **world;
  // A rank outside the group: an error naming MPI's complaint, and the process carries on.
  Status s = c.send("x", 1, c.size() + 3);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("MPI send"), std::string::npos) << s.message();
  EXPECT_TRUE(c.barrier().ok());
}

}  // namespace
}  // namespace pagoda::mpi

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
