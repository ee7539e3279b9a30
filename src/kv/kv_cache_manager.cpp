#include "kv/kv_cache_manager.h"

#include <xxhash.h>

#include <algorithm>
#include <string>

#include "base/check.h"

namespace pagoda {
namespace {

// Seed of every hash chain. Fixed (not random per process) so hashes agree across processes,
// which a cache-aware router reading KV events will need.
constexpr uint64_t kChainSeed = 0x9e3779b97f4a7c15ULL;

// The parent of block 0: mixes the salt in, so the salt isolates the whole chain.
uint64_t chain_root(uint64_t salt) { return XXH3_64bits_withSeed(&salt, sizeof(salt), kChainSeed); }

// hash_i = H(parent, tokens of block i): the parent hash seeds XXH3 over the block's token ids.
uint64_t block_hash_of(uint64_t parent, std::span<const TokenId> tokens) {
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

}  // namespace

uint64_t cache_salt_hash(std::string_view salt) {
  if (salt.empty()) return 0;
  const uint64_t h = XXH3_64bits(salt.data(), salt.size());
  // 0 means "no salt"; a non-empty salt must never alias it.
  return h == 0 ? 1 : h;
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_(config), pool_(config.num_blocks, config.block_size) {}

int64_t KvCacheManager::blocks_for(int64_t num_tokens) const {
  PAGODA_CHECK(num_tokens >= 0);
  return (num_tokens + config_.block_size - 1) / config_.block_size;
}

void KvCacheManager::set_block_hasher_for_testing(BlockHasher hasher) {
  PAGODA_CHECK(requests_.empty());
  hasher_ = hasher;
}

void KvCacheManager::extend_hashes(PerRequest& r, std::span<const TokenId> tokens,
                                   std::string_view salt) const {
  if (r.hashes.empty()) {
    r.salt.assign(salt);
  } else {
    // Hashes and links made under another salt would silently cross-contaminate prefixes.
    PAGODA_CHECK(r.salt == salt);
  }
  const int64_t bs = config_.block_size;
  const int64_t num_full = static_cast<int64_t>(tokens.size()) / bs;
  r.hashes.reserve(static_cast<size_t>(num_full));
  for (int64_t i = static_cast<int64_t>(r.hashes.size()); i < num_full; ++i) {
    const uint64_t parent =
        i == 0 ? chain_root(cache_salt_hash(salt)) : r.hashes[static_cast<size_t>(i - 1)];
    std::span<const TokenId> block =
        tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs));
    r.hashes.push_back(hasher_ ? hasher_(parent, block) : block_hash_of(parent, block));
  }
}

ComputedBlocks KvCacheManager::get_computed_blocks(RequestId id, std::span<const TokenId> tokens,
                                                   std::string_view salt) {
  ComputedBlocks out;
  if (!config_.enable_prefix_caching || tokens.empty()) return out;
  const int64_t bs = config_.block_size;
  // The last token is always recomputed (its logits are needed), so a prompt of exactly k full
  // blocks can hit at most k - 1 of them.
  const int64_t max_blocks = (static_cast<int64_t>(tokens.size()) - 1) / bs;
  PerRequest& r = requests_[id];
  extend_hashes(r, tokens.first(static_cast<size_t>(max_blocks * bs)), salt);
  // level: every cached block holding exactly this request's salted prefix up to block i - 1
  // (several when the prefix was cached more than once, each possibly with children of its
  // own). Block i must hang off one of them (block 0: carry the exact salt), so the hit is exact
  // however the hashes collide, and maximal.
  std::vector<BlockId> level{-1}, next;
  int64_t num_hit = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    pool_.lookup_all(r.hashes[static_cast<size_t>(i)],
                     tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)), level,
                     i == 0 ? salt : std::string_view(), next);
    // Blocks link to their parent, so a miss here means every later block misses too.
    if (next.empty()) break;
    level.swap(next);
    num_hit = i + 1;
  }
  // One chain of the deepest level, back up through its parents.
  out.blocks.resize(static_cast<size_t>(num_hit));
  if (num_hit > 0) {
    BlockId b = level.front();
    for (int64_t i = num_hit - 1; i >= 0; --i) {
      out.blocks[static_cast<size_t>(i)] = b;
      std::optional<BlockPool::ChainLink> link = pool_.chain_link(b);
      PAGODA_CHECK(link.has_value() && link->live);
      b = link->parent;
    }
    PAGODA_CHECK(b == -1);
  }
  out.num_tokens = static_cast<int64_t>(out.blocks.size()) * bs;
  stats_.queries += static_cast<int64_t>(tokens.size());
  stats_.hits += out.num_tokens;
  return out;
}

bool KvCacheManager::allocate_slots(RequestId id, std::span<const TokenId> tokens,
                                    int64_t num_computed_tokens, int64_t num_new_tokens,
                                    const ComputedBlocks& hit, std::string_view salt,
                                    int64_t commit_limit) {
  PAGODA_CHECK(num_computed_tokens >= 0 && num_new_tokens >= 0);
  const int64_t bs = config_.block_size;
  auto it = requests_.find(id);
  const int64_t num_existing = it == requests_.end() ? 0 : static_cast<int64_t>(it->second.blocks.size());
  const int64_t num_hit = static_cast<int64_t>(hit.blocks.size());
  if (num_hit > 0) {
    // A hit belongs to the first allocation, and num_computed_tokens must already count it.
    PAGODA_CHECK(num_existing == 0);
    PAGODA_CHECK(hit.num_tokens == num_hit * bs);
    PAGODA_CHECK(num_computed_tokens >= hit.num_tokens);
    PAGODA_CHECK(config_.enable_prefix_caching);
  }

  const int64_t total = num_computed_tokens + num_new_tokens;
  // Speculative slots from an earlier step may already cover more than `total`: nothing to add.
  const int64_t num_new_blocks = std::max<int64_t>(0, blocks_for(total) - num_existing - num_hit);
  // Touching a hit block that sits in the free queue takes it out of the free capacity too.
  int64_t num_hit_free = 0;
  for (BlockId b : hit.blocks) {
    // A hit must still be cached: nothing may have been allocated since get_computed_blocks.
    PAGODA_CHECK(pool_.is_cached(b));
    num_hit_free += pool_.ref_count(b) == 0;
  }
  if (num_new_blocks + num_hit_free > pool_.num_free_blocks()) return false;

  // From here on nothing can fail.
  PerRequest& r = it == requests_.end() ? requests_[id] : it->second;
  if (num_hit > 0) {
    pool_.touch(hit.blocks);
    r.blocks.insert(r.blocks.end(), hit.blocks.begin(), hit.blocks.end());
    // The hit blocks are cached already; committing starts after them.
    r.num_cached_blocks = num_hit;
  }
  if (num_new_blocks > 0) {
    std::vector<BlockId> fresh = pool_.allocate(static_cast<int32_t>(num_new_blocks));
    r.blocks.insert(r.blocks.end(), fresh.begin(), fresh.end());
  }

  if (config_.enable_prefix_caching) {
    // Only tokens that exist are cached: draft slots past tokens.size() are unverified.
    const int64_t num_full =
        std::min({total, static_cast<int64_t>(tokens.size()), commit_limit}) / bs;
    if (num_full > r.num_cached_blocks) {
      extend_hashes(r, tokens.first(static_cast<size_t>(num_full * bs)), salt);
      // In chain order: each block's parent (the request's previous block, which it holds) is
      // cached by the time the block is.
      for (int64_t i = r.num_cached_blocks; i < num_full; ++i) {
        const size_t at = static_cast<size_t>(i);
        pool_.cache_block(r.blocks[at], r.hashes[at],
                          tokens.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs)),
                          i == 0 ? -1 : r.blocks[at - 1],
                          i == 0 ? std::string_view(r.salt) : std::string_view());
      }
      r.num_cached_blocks = num_full;
    }
  }
  return true;
}

std::span<const BlockId> KvCacheManager::block_table(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  return it->second.blocks;
}

void KvCacheManager::free(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  // Tail first: the last block (the longest, least shareable prefix) is evicted first.
  std::vector<BlockId> reversed(it->second.blocks.rbegin(), it->second.blocks.rend());
  pool_.free_blocks(reversed);
  requests_.erase(it);
}

Status KvCacheManager::check_invariants() const {
  PAGODA_RETURN_IF_ERROR(pool_.check_invariants());
  std::vector<int32_t> holders(static_cast<size_t>(pool_.num_blocks()), 0);
  for (const auto& [id, r] : requests_) {
    auto fail = [id = id](int64_t i, const std::string& what) {
      return internal_error("KvCacheManager: request " + std::to_string(id) + " block " +
                            std::to_string(i) + " " + what);
    };
    if (r.num_cached_blocks > static_cast<int64_t>(r.blocks.size()) ||
        r.num_cached_blocks > static_cast<int64_t>(r.hashes.size())) {
      return fail(r.num_cached_blocks, "is committed beyond its blocks or hashes");
    }
    for (size_t i = 0; i < r.blocks.size(); ++i) {
      const BlockId b = r.blocks[i];
      const int64_t at = static_cast<int64_t>(i);
      if (b < 0 || b >= pool_.num_blocks()) return fail(at, "is not a block");
      ++holders[static_cast<size_t>(b)];
      if (pool_.ref_count(b) <= 0) return fail(at, "is held but has ref_count 0");
      std::optional<BlockPool::ChainLink> link = pool_.chain_link(b);
      if (at >= r.num_cached_blocks) {
        if (link) return fail(at, "is not committed but is cached");
        continue;
      }
      if (!link) return fail(at, "is committed but not cached");
      if (pool_.block_hash(b) != r.hashes[i]) return fail(at, "is cached under another hash");
      if (!link->live) return fail(at, "links to an evicted parent");  // (checked below too)
      if (i == 0 ? (link->parent != -1 || link->salt != r.salt)
                 : link->parent != r.blocks[i - 1]) {
        return fail(at, "is linked into another chain");
      }
    }
  }
  for (BlockId b = 0; b < pool_.num_blocks(); ++b) {
    if (pool_.ref_count(b) != holders[static_cast<size_t>(b)]) {
      return internal_error("KvCacheManager: block " + std::to_string(b) + " has ref_count " +
                            std::to_string(pool_.ref_count(b)) + " but " +
                            std::to_string(holders[static_cast<size_t>(b)]) + " holders");
    }
    if (holders[static_cast<size_t>(b)] > 1 && !pool_.is_cached(b)) {
      return internal_error("KvCacheManager: block " + std::to_string(b) + " is shared but not cached");
    }
    // Whoever holds a cached block holds its parent, and free blocks are queued children first
    // (free() is tail first), so a parent is never evicted before its cached children: the
    // generation check in lookup() is a second line of defence that the manager never needs.
    std::optional<BlockPool::ChainLink> link = pool_.chain_link(b);
    if (link && !link->live) {
      return internal_error("KvCacheManager: cached block " + std::to_string(b) +
                            " outlived its parent " + std::to_string(link->parent));
    }
  }
  return Status::ok_status();
}

}  // namespace pagoda
