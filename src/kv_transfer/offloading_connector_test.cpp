#include "kv_transfer/offloading_connector.h"

#include <gtest/gtest.h>

#include "scheduler/request.h"

namespace pagoda {
namespace {

TEST(OffloadingScheduler, KeysChainOverSaltAndTokens) {
  OffloadingSchedulerConfig c;
  c.block_size = 4;
  c.num_host_slots = 8;
  c.fingerprint[0] = 1;
  OffloadingScheduler s(c);
  const std::vector<TokenId> a{1, 2, 3, 4, 5, 6, 7, 8, 9};
  std::vector<TokenId> b = a;
  b[5] = 60;
  const auto ka = s.keys_for(a, "");
  const auto kb = s.keys_for(b, "");
  ASSERT_EQ(ka.size(), 2u);
  EXPECT_EQ(ka[0], kb[0]);
  EXPECT_NE(ka[1], kb[1]);
  EXPECT_NE(s.keys_for(a, "salt")[0], ka[0]);
  c.fingerprint[0] = 2;
  EXPECT_NE(OffloadingScheduler(c).keys_for(a, "")[0], ka[0]);
}

}  // namespace
}  // namespace pagoda
