#include "kv_transfer/offloading_connector.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "backend/cpu/cpu_backend.h"
#include "model/kv_cache.h"

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

OffloadingSchedulerConfig small(int64_t slots) {
  OffloadingSchedulerConfig c;
  c.block_size = 4;
  c.num_host_slots = slots;
  return c;
}

std::vector<TokenId> tokens(int seed, int n) {
  std::vector<TokenId> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = seed * 1000 + i;
  return t;
}

// Computed full blocks are saved once; a later request finds them (up to, never including, its
// last token); a load pins its slots against eviction until the workers report it.
TEST(OffloadingScheduler, SavesLooksUpAndPinsWhatItLoads) {
  OffloadingScheduler s(small(3));
  const std::vector<TokenId> a = tokens(1, 13);  // 3 full blocks and one token
  const std::vector<BlockId> table{7, 8, 9, 10};
  s.on_scheduled(KvRequest{1, a, "", true, nullptr}, 13, table);
  KvConnectorMetadata meta = s.build_meta();
  ASSERT_EQ(meta.stores.size(), 3u);
  EXPECT_EQ(meta.stores[0].block, 7);
  EXPECT_EQ(meta.stores[2].block, 9);
  s.on_scheduled(KvRequest{1, a, "", true, nullptr}, 13, table);  // nothing new
  EXPECT_TRUE(s.build_meta().stores.empty());
  s.request_finished(KvRequest{1, a, "", true, nullptr});

  // The same 12 tokens and one more: all three blocks found. Exactly 12 tokens: two (the last
  // token is computed), with a salt: none.
  EXPECT_EQ(s.get_num_new_matched_tokens(KvRequest{2, a, "", true, nullptr}, 0), 12);
  const std::vector<TokenId> twelve(a.begin(), a.begin() + 12);
  EXPECT_EQ(s.get_num_new_matched_tokens(KvRequest{3, twelve, "", true, nullptr}, 0), 8);
  EXPECT_EQ(s.get_num_new_matched_tokens(KvRequest{4, a, "x", true, nullptr}, 0), 0);
  EXPECT_EQ(s.get_num_new_matched_tokens(KvRequest{5, a, "", false, nullptr}, 0), 0);
  EXPECT_EQ(s.get_num_new_matched_tokens(KvRequest{2, a, "", true, nullptr}, 4), 8);  // after a local hit
  s.update_state_after_alloc(KvRequest{2, a, "", true, nullptr}, std::vector<BlockId>{1, 2, 3, 4}, 4, 8);
  meta = s.build_meta();
  ASSERT_EQ(meta.loads.size(), 1u);
  EXPECT_EQ(meta.awaiting, std::vector<RequestId>{2});
  ASSERT_EQ(meta.loads[0].blocks.size(), 2u);
  EXPECT_EQ(meta.loads[0].blocks[0].block, 2);
  EXPECT_GE(meta.loads[0].blocks[0].slot, 0);

  // Three slots, two pinned by the load: a new request's blocks can take only the third.
  const std::vector<TokenId> b = tokens(2, 12);
  s.on_scheduled(KvRequest{6, b, "", true, nullptr}, 12, std::vector<BlockId>{20, 21, 22});
  KvConnectorMetadata busy = s.build_meta();
  ASSERT_EQ(busy.stores.size(), 1u);
  for (const KvTierLoadBlock& l : meta.loads[0].blocks) EXPECT_NE(busy.stores[0].slot, l.slot);

  // The workers report the load done: a hit of 8 tokens, the slots free to evict again.
  KvConnectorOutput out;
  out.load_states = {KvLoadState::kDone};
  std::vector<RequestId> done, failed;
  s.update_connector_output(meta, out, done, failed);
  EXPECT_EQ(done, std::vector<RequestId>{2});
  EXPECT_TRUE(failed.empty());
  EXPECT_EQ(s.stats().hits, 8);
  EXPECT_EQ(s.stats().requests_waiting, 0);
  s.on_scheduled(KvRequest{6, b, "", true, nullptr}, 12, std::vector<BlockId>{20, 21, 22});
  EXPECT_EQ(s.build_meta().stores.size(), 2u);  // the rest of b, evicting a's blocks
  EXPECT_EQ(s.stats().host_blocks, 3);
}

// A report that does not match the step's list fails its loads rather than trusting it.
TEST(OffloadingScheduler, AMalformedReportFailsTheLoads) {
  OffloadingScheduler s(small(4));
  const std::vector<TokenId> a = tokens(1, 9);
  s.on_scheduled(KvRequest{1, a, "", true, nullptr}, 9, std::vector<BlockId>{0, 1, 2});
  s.build_meta();
  ASSERT_EQ(s.get_num_new_matched_tokens(KvRequest{2, a, "", true, nullptr}, 0), 8);
  s.update_state_after_alloc(KvRequest{2, a, "", true, nullptr}, std::vector<BlockId>{5, 6, 7}, 0, 8);
  const KvConnectorMetadata meta = s.build_meta();
  std::vector<RequestId> done, failed;
  s.update_connector_output(meta, KvConnectorOutput{}, done, failed);
  EXPECT_TRUE(done.empty());
  EXPECT_EQ(failed, std::vector<RequestId>{2});
  EXPECT_EQ(s.stats().failed_loads, 1);
}

// The worker side on a real KV cache: a block stored into a slot and loaded into another block
// comes back byte for byte, for a float and an int8 cache (its scales too).
TEST(OffloadingWorker, StoresAndLoadsBlocksByteForByte) {
  cpu::register_cpu_backend();
  auto backend = create_backend("cpu");
  ASSERT_TRUE(backend.ok());
  const Kernels& k = (*backend)->kernels();
  ModelConfig config;
  config.num_layers = 3;
  config.num_kv_heads = 2;
  config.head_dim = 8;
  for (KvCacheDtype dtype : {KvCacheDtype::kF32, KvCacheDtype::kF16, KvCacheDtype::kInt8}) {
    auto kv = KvCacheTensors::allocate(k, config, 6, 4, dtype);
    ASSERT_TRUE(kv.ok());
    EXPECT_EQ(kv->block_bytes(), KvCacheTensors::bytes_per_block(config, 4, dtype));
    std::vector<uint8_t> bytes(static_cast<size_t>(kv->block_bytes()));
    std::mt19937 rng(5);
    for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
    kv->copy_block_from_host(k, 2, bytes.data());

    KvConnectorWorkerConfig wc;
    wc.connector = "OffloadingConnector";
    wc.num_host_slots = 2;
    OffloadingWorker w(wc, "r0of1");
    ASSERT_TRUE(w.register_kv_caches(*kv, k).ok());
    KvConnectorMetadata store;
    store.stores.push_back(KvTierStore{2, 1, KvBlockKey{}, false});
    w.start_step(store, false);
    KvConnectorOutput out = w.finish_step(store);
    EXPECT_EQ(out.counters.stored_blocks, 1);
    EXPECT_EQ(out.counters.stored_bytes, kv->block_bytes());

    KvConnectorMetadata load;
    load.loads.push_back(KvTierLoad{9, {KvTierLoadBlock{5, 1, KvBlockKey{}}}});
    load.awaiting = {9};
    w.start_step(load, false);
    out = w.finish_step(load);
    EXPECT_EQ(out.load_states, std::vector<KvLoadState>{KvLoadState::kDone});
    std::vector<uint8_t> back(bytes.size());
    kv->copy_block_to_host(k, 5, back.data());
    EXPECT_EQ(back, bytes) << kv_cache_dtype_name(dtype);

    // A disk block without a disk tier, or a slot out of range, fails the load.
    KvConnectorMetadata bad;
    bad.loads.push_back(KvTierLoad{10, {KvTierLoadBlock{3, -1, KvBlockKey{}}}});
    bad.loads.push_back(KvTierLoad{11, {KvTierLoadBlock{3, 99, KvBlockKey{}}}});
    bad.awaiting = {10, 11, 12};
    w.start_step(bad, false);
    out = w.finish_step(bad);
    EXPECT_EQ(out.load_states,
              (std::vector<KvLoadState>{KvLoadState::kFailed, KvLoadState::kFailed, KvLoadState::kFailed}));
  }
}

}  // namespace
}  // namespace pagoda
