#include "kv/block_pool.h"

#include <gtest/gtest.h>

#include <vector>

namespace pagoda {
namespace {

using Ids = std::vector<BlockId>;

void expect_ok(const BlockPool& pool) {
  Status s = pool.check_invariants();
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(BlockPoolTest, FreshPoolIsAllFreeInIdOrder) {
  BlockPool pool(6, 4);
  EXPECT_EQ(pool.num_blocks(), 6);
  EXPECT_EQ(pool.block_size(), 4);
  EXPECT_EQ(pool.num_free_blocks(), 6);
  EXPECT_EQ(pool.usage(), 0.0);
  EXPECT_EQ(pool.free_queue(), (Ids{0, 1, 2, 3, 4, 5}));
  expect_ok(pool);
}

TEST(BlockPoolTest, AllocatePopsFromHeadAndFreeAppendsToTail) {
  BlockPool pool(6, 4);
  Ids a = pool.allocate(3);
  EXPECT_EQ(a, (Ids{0, 1, 2}));
  EXPECT_EQ(pool.ref_count(0), 1);
  EXPECT_EQ(pool.num_free_blocks(), 3);
  EXPECT_DOUBLE_EQ(pool.usage(), 0.5);
  // Freed in the order given (callers pass the tail block first).
  pool.free_blocks(Ids{2, 0});
  EXPECT_EQ(pool.free_queue(), (Ids{3, 4, 5, 2, 0}));
  EXPECT_EQ(pool.allocate(4), (Ids{3, 4, 5, 2}));
  EXPECT_EQ(pool.free_queue(), (Ids{0}));
  expect_ok(pool);
  EXPECT_EQ(pool.allocate(0), Ids{});
}

TEST(BlockPoolTest, TouchRemovesFromTheMiddleAndCounts) {
  BlockPool pool(5, 2);
  pool.touch(Ids{2});
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(pool.free_queue(), (Ids{0, 1, 3, 4}));
  pool.touch(Ids{2, 4, 0});
  EXPECT_EQ(pool.ref_count(2), 2);
  EXPECT_EQ(pool.free_queue(), (Ids{1, 3}));
  expect_ok(pool);
  pool.free_blocks(Ids{2});
  EXPECT_EQ(pool.ref_count(2), 1);
  EXPECT_EQ(pool.free_queue(), (Ids{1, 3}));  // still referenced: not queued
  pool.free_blocks(Ids{2, 4, 0});
  EXPECT_EQ(pool.free_queue(), (Ids{1, 3, 2, 4, 0}));
  expect_ok(pool);
}

TEST(BlockPoolTest, CachedBlockSurvivesFreeAndIsEvictedWhenPopped) {
  BlockPool pool(3, 2);
  Ids a = pool.allocate(1);
  const std::vector<TokenId> toks{7, 8};
  pool.cache_block(a[0], 42, toks, -1);
  EXPECT_TRUE(pool.is_cached(a[0]));
  EXPECT_EQ(pool.block_hash(a[0]), 42u);
  pool.free_blocks(a);
  // Free but still cached: a prefix hit can revive it.
  EXPECT_EQ(pool.lookup(42, toks, -1), a[0]);
  EXPECT_EQ(pool.free_queue(), (Ids{1, 2, 0}));
  EXPECT_EQ(pool.allocate(2), (Ids{1, 2}));
  EXPECT_TRUE(pool.is_cached(0));
  EXPECT_EQ(pool.allocate(1), (Ids{0}));
  // Popped from the head: evicted now.
  EXPECT_FALSE(pool.is_cached(0));
  EXPECT_EQ(pool.block_hash(0), std::nullopt);
  EXPECT_EQ(pool.lookup(42, toks, -1), std::nullopt);
  expect_ok(pool);
}

TEST(BlockPoolTest, LookupComparesTokensOnHashCollision) {
  BlockPool pool(4, 3);
  Ids a = pool.allocate(3);
  const std::vector<TokenId> x{1, 2, 3}, y{1, 2, 4}, z{9, 9, 9};
  constexpr uint64_t kSame = 0xabcdef;
  pool.cache_block(a[0], kSame, x, -1);
  pool.cache_block(a[1], kSame, y, -1);  // forced collision: same hash, different tokens
  EXPECT_EQ(pool.lookup(kSame, x, -1), a[0]);
  EXPECT_EQ(pool.lookup(kSame, y, -1), a[1]);
  EXPECT_EQ(pool.lookup(kSame, z, -1), std::nullopt);
  EXPECT_EQ(pool.lookup(kSame + 1, x, -1), std::nullopt);
  // Identical duplicates are tolerated; either may be returned.
  pool.cache_block(a[2], kSame, x, -1);
  std::optional<BlockId> d = pool.lookup(kSame, x, -1);
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(*d == a[0] || *d == a[2]);
  expect_ok(pool);
  // Evicting one duplicate leaves the other findable.
  pool.free_blocks(Ids{a[0]});
  pool.allocate(1);  // block 3 (never used)
  EXPECT_EQ(pool.allocate(1), (Ids{a[0]}));
  EXPECT_EQ(pool.lookup(kSame, x, -1), a[2]);
  EXPECT_EQ(pool.lookup(kSame, y, -1), a[1]);
  expect_ok(pool);
}

TEST(BlockPoolTest, CacheBlockTwiceKeepsFirst) {
  BlockPool pool(2, 2);
  Ids a = pool.allocate(1);
  pool.cache_block(a[0], 5, std::vector<TokenId>{1, 1}, -1, "s");
  pool.cache_block(a[0], 5, std::vector<TokenId>{1, 1}, -1, "s");
  expect_ok(pool);
  EXPECT_EQ(pool.lookup(5, std::vector<TokenId>{1, 1}, -1, "s"), a[0]);
}

TEST(BlockPoolTest, ResetPrefixCacheOnlyWhenIdle) {
  BlockPool pool(4, 2);
  Ids a = pool.allocate(2);
  pool.cache_block(a[0], 1, std::vector<TokenId>{1, 2}, -1);
  pool.cache_block(a[1], 2, std::vector<TokenId>{3, 4}, a[0]);
  pool.free_blocks(Ids{a[1]});
  EXPECT_FALSE(pool.reset_prefix_cache());  // a[0] still in use
  EXPECT_TRUE(pool.is_cached(a[1]));
  pool.free_blocks(Ids{a[0]});
  const Ids order = pool.free_queue();
  EXPECT_TRUE(pool.reset_prefix_cache());
  EXPECT_FALSE(pool.is_cached(a[0]));
  EXPECT_FALSE(pool.is_cached(a[1]));
  EXPECT_EQ(pool.lookup(1, std::vector<TokenId>{1, 2}, -1), std::nullopt);
  EXPECT_EQ(pool.free_queue(), order);  // the queue order is kept
  EXPECT_EQ(pool.generation(a[0]), 1u);  // dropped contents: a new generation
  EXPECT_EQ(pool.generation(a[1]), 1u);
  expect_ok(pool);
}

TEST(BlockPoolTest, EmptyPool) {
  BlockPool pool(0, 16);
  EXPECT_EQ(pool.num_free_blocks(), 0);
  EXPECT_EQ(pool.usage(), 0.0);
  EXPECT_TRUE(pool.reset_prefix_cache());
  expect_ok(pool);
}

// Two different chains forced onto the same hashes, whose second blocks hold the same tokens:
// the parent link keeps each chain's second block to its own first block.
TEST(BlockPoolTest, CollidingChainsNeverCrossOver) {
  BlockPool pool(6, 2);
  const std::vector<TokenId> x{1, 2}, x2{3, 4}, y{5, 6};
  constexpr uint64_t kH0 = 7, kH1 = 8;
  Ids a = pool.allocate(2), b = pool.allocate(2);
  pool.cache_block(a[0], kH0, x, -1);
  pool.cache_block(a[1], kH1, y, a[0]);
  pool.cache_block(b[0], kH0, x2, -1);  // a different first block under the same hash
  pool.cache_block(b[1], kH1, y, b[0]);  // same hash, same tokens, different chain
  expect_ok(pool);
  EXPECT_EQ(pool.lookup(kH0, x, -1), a[0]);
  EXPECT_EQ(pool.lookup(kH0, x2, -1), b[0]);
  EXPECT_EQ(pool.lookup(kH1, y, a[0]), a[1]);
  EXPECT_EQ(pool.lookup(kH1, y, b[0]), b[1]);
  ASSERT_TRUE(pool.chain_link(b[1]).has_value());
  EXPECT_EQ(pool.chain_link(b[1])->parent, b[0]);
  EXPECT_TRUE(pool.chain_link(b[1])->live);
  EXPECT_EQ(pool.chain_link(a[0])->parent, -1);
  // A second block is never found as a first block, nor a first block as a second.
  EXPECT_EQ(pool.lookup(kH1, y, -1), std::nullopt);
  EXPECT_EQ(pool.lookup(kH0, x2, a[0]), std::nullopt);

  // Chain a is freed (tail first) and its first block is evicted and reused for other data
  // under the very same hash, while its old second block is still cached: the old link must not
  // match the new incarnation of the parent.
  pool.free_blocks(Ids{a[1]});  // queue: 4 5 a1
  pool.free_blocks(Ids{a[0]});  // queue: 4 5 a1 a0
  const uint64_t gen = pool.generation(a[0]);
  Ids fill = pool.allocate(2);  // 4 5
  // Keep a[1] cached but out of the way: take it as a hit, then pop a[0].
  pool.touch(Ids{a[1]});
  EXPECT_EQ(pool.allocate(1), (Ids{a[0]}));
  EXPECT_EQ(pool.generation(a[0]), gen + 1);
  EXPECT_FALSE(pool.chain_link(a[1])->live);
  pool.cache_block(a[0], kH0, x2, -1);  // now a duplicate of b[0]'s content and hash
  EXPECT_EQ(pool.lookup(kH1, y, a[0]), std::nullopt);  // a[1] links to the old a[0]
  EXPECT_EQ(pool.lookup(kH1, y, b[0]), b[1]);
  expect_ok(pool);
  // A block cached at generation g is matched only while its parent stays at generation g.
  pool.cache_block(fill[0], kH1, y, a[0]);
  EXPECT_EQ(pool.lookup(kH1, y, a[0]), fill[0]);
  expect_ok(pool);
}

// First blocks under colliding hashes and equal tokens are told apart by the exact salt.
TEST(BlockPoolTest, FirstBlocksMatchTheExactSalt) {
  BlockPool pool(4, 2);
  const std::vector<TokenId> x{1, 2};
  constexpr uint64_t kSame = 3;
  Ids a = pool.allocate(3);
  pool.cache_block(a[0], kSame, x, -1, "alice");
  pool.cache_block(a[1], kSame, x, -1, "bob");
  pool.cache_block(a[2], kSame, x, -1);
  EXPECT_EQ(pool.lookup(kSame, x, -1, "alice"), a[0]);
  EXPECT_EQ(pool.lookup(kSame, x, -1, "bob"), a[1]);
  EXPECT_EQ(pool.lookup(kSame, x, -1, ""), a[2]);
  EXPECT_EQ(pool.lookup(kSame, x, -1, "carol"), std::nullopt);
  EXPECT_EQ(pool.lookup(kSame, x, -1, std::string_view("alice\0", 6)), std::nullopt);
  EXPECT_EQ(pool.chain_link(a[1])->salt, "bob");
  expect_ok(pool);
}

TEST(BlockPoolDeathTest, MisuseIsABug) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  BlockPool pool(2, 2);
  EXPECT_DEATH(pool.allocate(3), "PAGODA_CHECK");
  EXPECT_DEATH(pool.free_blocks(Ids{0}), "PAGODA_CHECK");  // ref_count already 0
  EXPECT_DEATH(pool.ref_count(7), "PAGODA_CHECK");
  EXPECT_DEATH(pool.cache_block(1, 3, std::vector<TokenId>{1, 2}, -1), "PAGODA_CHECK");  // not in use
  Ids a = pool.allocate(2);
  // A parent must be cached; a block is not its own parent; only first blocks carry a salt.
  EXPECT_DEATH(pool.cache_block(a[1], 3, std::vector<TokenId>{1, 2}, a[0]), "PAGODA_CHECK");
  EXPECT_DEATH(pool.cache_block(a[0], 3, std::vector<TokenId>{1, 2}, a[0]), "PAGODA_CHECK");
  pool.cache_block(a[0], 3, std::vector<TokenId>{1, 2}, -1, "salt");
  EXPECT_DEATH(pool.cache_block(a[1], 4, std::vector<TokenId>{1, 2}, a[0], "salt"), "PAGODA_CHECK");
  EXPECT_DEATH((void)pool.lookup(4, std::vector<TokenId>{1, 2}, a[1]), "PAGODA_CHECK");
  // Re-caching under another link or salt is a bug.
  EXPECT_DEATH(pool.cache_block(a[0], 3, std::vector<TokenId>{1, 2}, -1, "other"), "PAGODA_CHECK");
}

}  // namespace
}  // namespace pagoda
