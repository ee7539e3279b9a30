#include "kv/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <string_view>
#include <vector>

namespace pagoda {
namespace {

using Ids = std::vector<BlockId>;
using Tokens = std::vector<TokenId>;

Tokens iota_tokens(int n, TokenId start) {
  Tokens t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

Ids ids(std::span<const BlockId> s) { return Ids(s.begin(), s.end()); }

void expect_ok(const KvCacheManager& m) {
  Status s = m.check_invariants();
  EXPECT_TRUE(s.ok()) << s.message();
}

// Admits a request the way the scheduler does: look up the prefix, then allocate the rest.
bool admit(KvCacheManager& m, RequestId id, const Tokens& t, std::string_view salt = "",
           ComputedBlocks* hit_out = nullptr) {
  ComputedBlocks hit = m.get_computed_blocks(id, t, salt);
  if (hit_out) *hit_out = hit;
  return m.allocate_slots(id, t, hit.num_tokens, static_cast<int64_t>(t.size()) - hit.num_tokens,
                          hit, salt);
}

KvCacheManager make(int32_t num_blocks, int32_t block_size, bool caching = true) {
  return KvCacheManager(KvCacheConfig{num_blocks, block_size, caching});
}

TEST(KvCacheManagerTest, BlocksFor) {
  KvCacheManager m = make(4, 4);
  EXPECT_EQ(m.blocks_for(0), 0);
  EXPECT_EQ(m.blocks_for(1), 1);
  EXPECT_EQ(m.blocks_for(4), 1);
  EXPECT_EQ(m.blocks_for(5), 2);
}

TEST(KvCacheManagerTest, SharedPrefixOfThreeBlocksHits) {
  KvCacheManager m = make(20, 4);
  const Tokens prefix = iota_tokens(12, 100);
  ASSERT_TRUE(admit(m, 1, concat(prefix, {1, 2, 3})));
  const Ids first = ids(m.block_table(1));
  ASSERT_EQ(first.size(), 4u);

  const Tokens second = concat(prefix, {7, 8});
  ComputedBlocks hit;
  ASSERT_TRUE(admit(m, 2, second, "", &hit));
  EXPECT_EQ(hit.blocks, (Ids{first[0], first[1], first[2]}));
  EXPECT_EQ(hit.num_tokens, 12);
  const Ids table = ids(m.block_table(2));
  ASSERT_EQ(table.size(), 4u);
  EXPECT_EQ(Ids(table.begin(), table.begin() + 3), hit.blocks);
  EXPECT_NE(table[3], first[3]);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(m.pool().ref_count(first[i]), 2);
  expect_ok(m);

  // A prompt of exactly three blocks: the last token is recomputed, so only two blocks hit.
  ComputedBlocks exact = m.get_computed_blocks(3, prefix, "");
  EXPECT_EQ(exact.blocks, (Ids{first[0], first[1]}));
  EXPECT_EQ(exact.num_tokens, 8);
  // One token more and the third block can hit.
  EXPECT_EQ(m.get_computed_blocks(4, concat(prefix, {5}), "").blocks.size(), 3u);
  m.free(3);
  m.free(4);
}

TEST(KvCacheManagerTest, MissStopsTheWalk) {
  KvCacheManager m = make(20, 4);
  const Tokens a = iota_tokens(17, 0);
  ASSERT_TRUE(admit(m, 1, a));
  Tokens b = a;
  b[5] = 999;  // block 1 differs; blocks 2 and 3 are identical but their chain differs
  EXPECT_EQ(m.get_computed_blocks(2, b, "").blocks.size(), 1u);
}

void salt_isolates_prefixes(KvCacheManager& m) {
  const Tokens t = iota_tokens(13, 5);
  ASSERT_TRUE(admit(m, 1, t, "alice"));
  EXPECT_TRUE(m.get_computed_blocks(2, t, "bob").blocks.empty());
  EXPECT_TRUE(m.get_computed_blocks(3, t, "").blocks.empty());
  EXPECT_EQ(m.get_computed_blocks(4, t, "alice").blocks.size(), 3u);
  // Salts compare as exact strings (an embedded NUL included).
  EXPECT_TRUE(m.get_computed_blocks(8, t, std::string_view("alice\0", 6)).blocks.empty());
  // Unsalted prefixes do not serve salted requests either.
  ASSERT_TRUE(admit(m, 5, iota_tokens(13, 500), ""));
  EXPECT_TRUE(m.get_computed_blocks(6, iota_tokens(13, 500), "alice").blocks.empty());
  EXPECT_EQ(m.get_computed_blocks(7, iota_tokens(13, 500), "").blocks.size(), 3u);
  // A bob request of its own is cached beside alice's, under the same hashes when they collide.
  ASSERT_TRUE(admit(m, 9, t, "bob"));
  const Ids bob_blocks = ids(m.block_table(9));
  EXPECT_EQ(m.get_computed_blocks(10, t, "bob").blocks,
            (Ids{bob_blocks[0], bob_blocks[1], bob_blocks[2]}));
  EXPECT_EQ(m.get_computed_blocks(11, t, "alice").blocks, (Ids(m.block_table(1).begin(),
                                                              m.block_table(1).begin() + 3)));
  expect_ok(m);
}

TEST(KvCacheManagerTest, SaltIsolatesPrefixes) {
  EXPECT_NE(cache_salt_hash("alice"), 0u);
  EXPECT_NE(cache_salt_hash("alice"), cache_salt_hash("bob"));
  EXPECT_EQ(cache_salt_hash(""), 0u);
  KvCacheManager m = make(20, 4);
  salt_isolates_prefixes(m);
}

// Every block hashes alike, so all chains, and all salts, collide on every hash (as crafted
// prompts could make them under XXH3, whose seed is public).
uint64_t constant_hasher(uint64_t, std::span<const TokenId>) { return 42; }

TEST(KvCacheManagerTest, SaltIsolatesPrefixesEvenWhenSaltHashesCollide) {
  KvCacheManager m = make(20, 4);
  m.set_block_hasher_for_testing(constant_hasher);
  salt_isolates_prefixes(m);
}

TEST(KvCacheManagerTest, CollidingChainsNeverServeEachOthersBlocks) {
  KvCacheManager m = make(20, 4);
  m.set_block_hasher_for_testing(constant_hasher);
  // Two prompts that differ only in block 0: blocks 1 and 2 hold the same tokens and every hash
  // is the same, so only the parent links tell the chains apart.
  const Tokens tail = iota_tokens(9, 100);
  const Tokens a = concat(iota_tokens(4, 0), tail), b = concat(iota_tokens(4, 50), tail);
  ASSERT_TRUE(admit(m, 1, a));
  const Ids table_a = ids(m.block_table(1));
  ComputedBlocks hit;
  ASSERT_TRUE(admit(m, 2, b, "", &hit));
  EXPECT_TRUE(hit.blocks.empty()) << "chain b was served chain a's blocks";
  const Ids table_b = ids(m.block_table(2));
  expect_ok(m);
  // Each chain still finds exactly its own blocks among the colliding candidates.
  EXPECT_EQ(m.get_computed_blocks(3, concat(a, {1}), "").blocks,
            (Ids{table_a[0], table_a[1], table_a[2]}));
  EXPECT_EQ(m.get_computed_blocks(4, concat(b, {1}), "").blocks,
            (Ids{table_b[0], table_b[1], table_b[2]}));
  // Sharing a's block 0, then going another way for one block: only block 0 hits, even though
  // the block after that equals a's block 2 (and its hash is the same).
  const Tokens c = concat(concat(iota_tokens(4, 0), iota_tokens(4, 900)),
                          Tokens(tail.begin() + 4, tail.end()));
  EXPECT_EQ(m.get_computed_blocks(5, c, "").blocks, (Ids{table_a[0]}));
  // A prompt made of a's block 1 alone never hits it as a first block.
  EXPECT_TRUE(m.get_computed_blocks(6, Tokens(tail.begin(), tail.end()), "").blocks.empty());
  for (RequestId id : {3, 4, 5, 6}) m.free(id);
  m.free(1);
  m.free(2);
  expect_ok(m);
  EXPECT_EQ(m.get_computed_blocks(7, concat(b, {1}), "").blocks,
            (Ids{table_b[0], table_b[1], table_b[2]}));
}

// Two requests with the same prompt both miss (neither has committed yet) and cache it in blocks
// of their own: the same prefix is then cached twice, and only one copy has the later blocks.
// The walk follows every copy, so the hit is still the longest cached prefix, whichever copy the
// index happens to list first (both orders are tried).
TEST(KvCacheManagerTest, DuplicatePrefixesStillGiveTheLongestHit) {
  for (bool short_first : {true, false}) {
    SCOPED_TRACE(short_first ? "short copy committed first" : "long copy committed first");
    KvCacheManager m = make(16, 4);
    const Tokens t = iota_tokens(13, 0);
    EXPECT_TRUE(m.get_computed_blocks(1, t, "").blocks.empty());
    EXPECT_TRUE(m.get_computed_blocks(2, t, "").blocks.empty());
    // Request 1 prefills one block only (a chunk); request 2 prefills its whole prompt.
    auto short_chunk = [&] { ASSERT_TRUE(m.allocate_slots(1, t, 0, 4, {}, "")); };
    auto whole = [&] { ASSERT_TRUE(m.allocate_slots(2, t, 0, 13, {}, "")); };
    if (short_first) {
      short_chunk();
      whole();
    } else {
      whole();
      short_chunk();
    }
    const Ids one = ids(m.block_table(1)), two = ids(m.block_table(2));
    ASSERT_TRUE(m.pool().is_cached(one[0]));
    ASSERT_NE(one[0], two[0]);
    expect_ok(m);
    EXPECT_EQ(m.get_computed_blocks(3, concat(t, {1}), "").blocks, (Ids{two[0], two[1], two[2]}));
    // Both copies serve the one-block prefix; one of them is returned.
    const Ids first = m.get_computed_blocks(4, Tokens(t.begin(), t.begin() + 5), "").blocks;
    ASSERT_EQ(first.size(), 1u);
    EXPECT_TRUE(first[0] == one[0] || first[0] == two[0]);
  }
}

struct PoolSnapshot {
  std::vector<BlockId> free_queue;
  std::vector<int32_t> ref_counts;
  std::vector<std::optional<uint64_t>> hashes;
  bool operator==(const PoolSnapshot&) const = default;
};

PoolSnapshot snapshot(const BlockPool& p) {
  PoolSnapshot s{p.free_queue(), {}, {}};
  for (BlockId b = 0; b < p.num_blocks(); ++b) {
    s.ref_counts.push_back(p.ref_count(b));
    s.hashes.push_back(p.block_hash(b));
  }
  return s;
}

TEST(KvCacheManagerTest, FailedAllocationHasNoSideEffects) {
  KvCacheManager m = make(8, 4);
  const Tokens shared = iota_tokens(8, 0);
  ASSERT_TRUE(admit(m, 1, concat(shared, {50})));  // 3 blocks, 2 cached
  m.free(1);                                       // free queue: 3..7, 2, 1, 0 (all free)
  ASSERT_TRUE(admit(m, 2, iota_tokens(16, 1000)));  // takes 3 4 5 6
  // 4 free: 7 2 1 0; blocks 1 and 0 are the free cached hit.
  const Tokens big = concat(shared, iota_tokens(12, 2000));  // 20 tokens: 5 blocks
  ComputedBlocks hit = m.get_computed_blocks(3, big, "");
  ASSERT_EQ(hit.blocks.size(), 2u);
  // Needs 3 new + 2 free hit blocks = 5 > 4 free: refused even though 3 <= 4.
  const PoolSnapshot before = snapshot(m.pool());
  const PrefixCacheStats stats_before = m.stats();
  EXPECT_FALSE(m.allocate_slots(3, big, hit.num_tokens, 12, hit, ""));
  EXPECT_EQ(snapshot(m.pool()), before);
  EXPECT_TRUE(m.block_table(3).empty());
  EXPECT_EQ(m.stats().queries, stats_before.queries);
  expect_ok(m);

  // Growth of a running request that does not fit changes nothing either.
  const Tokens two = iota_tokens(16, 1000);
  const Ids table_before = ids(m.block_table(2));
  EXPECT_FALSE(m.allocate_slots(2, two, 16, 17, {}, ""));  // 33 tokens: 9 blocks > 4 + 4
  EXPECT_EQ(snapshot(m.pool()), before);
  EXPECT_EQ(ids(m.block_table(2)), table_before);
  // ...and a smaller step that fits succeeds.
  EXPECT_TRUE(m.allocate_slots(2, two, 16, 4, {}, ""));
  EXPECT_EQ(m.block_table(2).size(), 5u);
  expect_ok(m);
}

TEST(KvCacheManagerTest, FreeIsTailFirst) {
  KvCacheManager m = make(8, 4);
  ASSERT_TRUE(admit(m, 1, iota_tokens(10, 0)));  // blocks 0 1 2
  ASSERT_TRUE(admit(m, 2, iota_tokens(5, 50)));  // blocks 3 4
  EXPECT_EQ(m.pool().free_queue(), (Ids{5, 6, 7}));
  m.free(1);
  EXPECT_EQ(m.pool().free_queue(), (Ids{5, 6, 7, 2, 1, 0}));
  m.free(2);
  EXPECT_EQ(m.pool().free_queue(), (Ids{5, 6, 7, 2, 1, 0, 4, 3}));
  EXPECT_TRUE(m.block_table(1).empty());
  m.free(1);  // unknown: no-op
  EXPECT_EQ(m.num_free_blocks(), 8);
  expect_ok(m);
}

TEST(KvCacheManagerTest, DecodeGrowthCommitsFullBlocks) {
  KvCacheManager m = make(8, 4);
  Tokens t = iota_tokens(6, 0);
  ASSERT_TRUE(admit(m, 1, t));
  EXPECT_EQ(m.block_table(1).size(), 2u);
  EXPECT_TRUE(m.pool().is_cached(m.block_table(1)[0]));
  EXPECT_FALSE(m.pool().is_cached(m.block_table(1)[1]));
  for (TokenId next : {6, 7}) {
    const int64_t computed = static_cast<int64_t>(t.size());
    t.push_back(next);
    ASSERT_TRUE(m.allocate_slots(1, t, computed, 1, {}, ""));
  }
  EXPECT_EQ(m.block_table(1).size(), 2u);
  EXPECT_TRUE(m.pool().is_cached(m.block_table(1)[1]));  // 8 tokens: block 1 is full
  // Lookahead (draft) slots beyond the real tokens get blocks but are never cached.
  ASSERT_TRUE(m.allocate_slots(1, t, 8, 5, {}, ""));
  ASSERT_EQ(m.block_table(1).size(), 4u);
  EXPECT_FALSE(m.pool().is_cached(m.block_table(1)[2]));
  // A later, smaller step needs no new block.
  t.push_back(8);
  ASSERT_TRUE(m.allocate_slots(1, t, 8, 1, {}, ""));
  EXPECT_EQ(m.block_table(1).size(), 4u);
  expect_ok(m);
}

TEST(KvCacheManagerTest, ChunkedPrefillCommitsOnlyComputedBlocks) {
  KvCacheManager m = make(8, 4);
  const Tokens t = iota_tokens(14, 0);
  ASSERT_TRUE(m.allocate_slots(1, t, 0, 6, {}, ""));  // first chunk: 6 of 14 tokens
  ASSERT_EQ(m.block_table(1).size(), 2u);
  EXPECT_TRUE(m.pool().is_cached(m.block_table(1)[0]));
  EXPECT_FALSE(m.pool().is_cached(m.block_table(1)[1]));
  ASSERT_TRUE(m.allocate_slots(1, t, 6, 8, {}, ""));
  ASSERT_EQ(m.block_table(1).size(), 4u);
  EXPECT_TRUE(m.pool().is_cached(m.block_table(1)[2]));
  EXPECT_FALSE(m.pool().is_cached(m.block_table(1)[3]));
  EXPECT_EQ(m.get_computed_blocks(2, t, "").blocks.size(), 3u);
}

TEST(KvCacheManagerTest, CachingDisabledNeverHits) {
  KvCacheManager m = make(16, 4, /*caching=*/false);
  const Tokens t = iota_tokens(13, 0);
  ASSERT_TRUE(admit(m, 1, t));
  for (BlockId b : m.block_table(1)) EXPECT_FALSE(m.pool().is_cached(b));
  ComputedBlocks hit = m.get_computed_blocks(2, t, "");
  EXPECT_TRUE(hit.blocks.empty());
  EXPECT_EQ(hit.num_tokens, 0);
  m.free(1);
  EXPECT_TRUE(m.get_computed_blocks(3, t, "").blocks.empty());
  EXPECT_EQ(m.stats().queries, 0);
  EXPECT_EQ(m.stats().hits, 0);
  expect_ok(m);
}

TEST(KvCacheManagerTest, StatsCountQueriedAndHitTokens) {
  KvCacheManager m = make(16, 4);
  const Tokens t = iota_tokens(13, 0);
  ASSERT_TRUE(admit(m, 1, t));  // 13 queried, 0 hit
  EXPECT_EQ(m.stats().queries, 13);
  EXPECT_EQ(m.stats().hits, 0);
  ASSERT_TRUE(admit(m, 2, concat(t, {1, 2})));  // 15 queried, 12 hit
  EXPECT_EQ(m.stats().queries, 28);
  EXPECT_EQ(m.stats().hits, 12);
  (void)m.get_computed_blocks(3, Tokens{}, "");  // empty prompt: nothing to look up
  EXPECT_EQ(m.stats().queries, 28);
}

TEST(KvCacheManagerTest, ResetPrefixCache) {
  KvCacheManager m = make(8, 4);
  const Tokens t = iota_tokens(9, 0);
  ASSERT_TRUE(admit(m, 1, t));
  EXPECT_FALSE(m.reset_prefix_cache());
  m.free(1);
  EXPECT_EQ(m.get_computed_blocks(2, t, "").blocks.size(), 2u);
  EXPECT_TRUE(m.reset_prefix_cache());
  EXPECT_TRUE(m.get_computed_blocks(2, t, "").blocks.empty());
  expect_ok(m);
}

TEST(KvCacheManagerTest, PreemptedRequestRehitsItsOwnPrefix) {
  KvCacheManager m = make(8, 4);
  Tokens t = iota_tokens(10, 0);
  ASSERT_TRUE(admit(m, 1, t));
  const Ids table = ids(m.block_table(1));
  m.free(1);  // preempted
  ComputedBlocks hit;
  ASSERT_TRUE(admit(m, 1, t, "", &hit));
  EXPECT_EQ(hit.blocks, (Ids{table[0], table[1]}));
  EXPECT_EQ(ids(m.block_table(1)).size(), 3u);
  expect_ok(m);
}

// vllm-engine-notes.md §2.7: block size 4, 10 blocks.
TEST(KvCacheManagerTest, WorkedExampleFromTheNotes) {
  KvCacheManager m = make(10, 4);
  // Request 0: 14 prompt tokens -> blocks 0 1 2 3 (3 full, cached).
  Tokens r0 = iota_tokens(14, 0);
  ASSERT_TRUE(admit(m, 0, r0));
  EXPECT_EQ(ids(m.block_table(0)), (Ids{0, 1, 2, 3}));
  // It decodes until block 3 is full (cached), then needs block 4 for token 17.
  for (TokenId next : {14, 15, 16}) {
    const int64_t computed = static_cast<int64_t>(r0.size());
    r0.push_back(next);
    ASSERT_TRUE(m.allocate_slots(0, r0, computed, 1, {}, ""));
  }
  EXPECT_EQ(ids(m.block_table(0)), (Ids{0, 1, 2, 3, 4}));
  EXPECT_TRUE(m.pool().is_cached(3));
  EXPECT_FALSE(m.pool().is_cached(4));
  // Request 1: 14 tokens, the first 10 shared with request 0: only 2 blocks hit.
  Tokens r1 = concat(Tokens(r0.begin(), r0.begin() + 10), iota_tokens(4, 900));
  ComputedBlocks hit1;
  ASSERT_TRUE(admit(m, 1, r1, "", &hit1));
  EXPECT_EQ(hit1.blocks, (Ids{0, 1}));
  EXPECT_EQ(ids(m.block_table(1)), (Ids{0, 1, 5, 6}));
  // Request 0 finishes (4 3 2 queued; 1 and 0 still used), then request 1.
  m.free(0);
  EXPECT_EQ(m.pool().free_queue(), (Ids{7, 8, 9, 4, 3, 2}));
  m.free(1);
  EXPECT_EQ(m.pool().free_queue(), (Ids{7, 8, 9, 4, 3, 2, 6, 5, 1, 0}));
  // Request 2: 29 tokens, the first 12 shared with request 0: hits 0 1 2, pops 7 8 9 4 3.
  Tokens r2 = concat(Tokens(r0.begin(), r0.begin() + 12), iota_tokens(17, 5000));
  ComputedBlocks hit2 = m.get_computed_blocks(2, r2, "");
  EXPECT_EQ(hit2.blocks, (Ids{0, 1, 2}));
  EXPECT_TRUE(m.pool().is_cached(3));
  ASSERT_TRUE(m.allocate_slots(2, r2, hit2.num_tokens, 17, hit2, ""));
  EXPECT_EQ(ids(m.block_table(2)), (Ids{0, 1, 2, 7, 8, 9, 4, 3}));
  EXPECT_EQ(m.pool().free_queue(), (Ids{6, 5}));
  // Block 3 was evicted when popped (request 2 has not filled it): request 0's block 3 is gone.
  EXPECT_FALSE(m.pool().is_cached(3));
  EXPECT_EQ(m.get_computed_blocks(9, Tokens(r0.begin(), r0.begin() + 17), "").blocks.size(), 3u);
  expect_ok(m);
}

TEST(KvCacheManagerDeathTest, HitOnlyOnFirstAllocation) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  KvCacheManager m = make(8, 4);
  const Tokens t = iota_tokens(9, 0);
  ASSERT_TRUE(admit(m, 1, t));
  ComputedBlocks hit = m.get_computed_blocks(2, t, "");
  ASSERT_FALSE(hit.blocks.empty());
  EXPECT_DEATH((void)m.allocate_slots(1, t, 9, 1, hit, ""), "PAGODA_CHECK");
  // num_computed_tokens must include the hit.
  EXPECT_DEATH((void)m.allocate_slots(2, t, 0, 9, hit, ""), "PAGODA_CHECK");
}

}  // namespace
}  // namespace pagoda
