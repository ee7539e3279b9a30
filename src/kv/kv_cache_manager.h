// KvCacheManager: which KV blocks each request owns, and automatic prefix caching on top of a
// BlockPool. Bookkeeping only; the memory itself lives in the runner's KvCacheTensors.
//
// Full blocks are indexed by a chained hash: hash_i = H(hash_{i-1}, tokens of block i), with
// hash_{-1} derived from the hash of the request's cache salt. H is XXH3-64, which is fast but not
// collision-resistant (its seed is public), so the hash only narrows the search: a hit must also
// match the block's token ids, its parent link (block i's parent must be the very block that
// matched block i - 1, in the same cached generation) and, for block 0, the exact salt string.
// A hit therefore holds exactly the salted prefix asked for, by construction, even when crafted
// prompts collide on every hash (see BlockPool).
// Hashes of a request's full blocks are computed incrementally as its tokens grow, so a
// request's tokens must only ever be appended to. Used by the engine thread only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "kv/block_pool.h"

namespace pagoda {

struct KvCacheConfig {
  int32_t num_blocks = 0;
  int32_t block_size = 16;
  bool enable_prefix_caching = true;
};

// Blocks found in the prefix cache for a request, not yet referenced.
struct ComputedBlocks {
  std::vector<BlockId> blocks;
  int64_t num_tokens = 0;  // blocks.size() * block_size
};

struct PrefixCacheStats {
  int64_t queries = 0;  // prompt tokens looked up
  int64_t hits = 0;     // of those, found cached
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  // The longest cached prefix of `tokens` (a request's tokens so far) in whole blocks, at most
  // (tokens.size() - 1) tokens so the last token is always recomputed for its logits. `salt`
  // isolates prefixes: only a request with exactly the same salt string shares them ("" = none).
  // Empty when caching is off. Counts queries and hits. Keeps the
  // request's block hashes for allocate_slots (free(id) drops them if it is never admitted).
  // The blocks stay valid only until the next allocation for another request: pass them to
  // allocate_slots for `id` right away.
  ComputedBlocks get_computed_blocks(RequestId id, std::span<const TokenId> tokens,
                                     std::string_view salt);

  // Gives request `id` slots for tokens [0, num_computed_tokens + num_new_tokens): blocks are
  // added until the request owns blocks_for(num_computed_tokens + num_new_tokens) of them.
  // `tokens` are the request's tokens so far (prompt + output); num_new_tokens may run past
  // tokens.size() (speculative drafts), such slots are allocated but never cached.
  //
  // `hit` comes from get_computed_blocks and is given on the request's first allocation only
  // (when it owns no blocks; pass {} otherwise). On that call num_computed_tokens already
  // INCLUDES the hit: it is hit.num_tokens (plus nothing else) for a new or resumed request, and
  // num_new_tokens counts only the tokens after the hit. The hit blocks are referenced and
  // placed first in the request's block table.
  //
  // All or nothing: returns false and changes nothing (pool, block table, stats) when the free
  // blocks do not suffice, counting the hit blocks that are currently free as consumed. On
  // success, when prefix caching is on, commits every full block of
  // tokens[0, min(num_computed_tokens + num_new_tokens, tokens.size())) not yet committed.
  // `salt` must be the one given to get_computed_blocks. `commit_limit` stops the commit at
  // that many tokens: blocks a KV connector is still to fill are published by a later call, once
  // their contents are there.
  bool allocate_slots(RequestId id, std::span<const TokenId> tokens, int64_t num_computed_tokens,
                      int64_t num_new_tokens, const ComputedBlocks& hit, std::string_view salt,
                      int64_t commit_limit = INT64_MAX);

  // The request's blocks in order (empty for an unknown id).
  std::span<const BlockId> block_table(RequestId id) const;

  // Releases all blocks of `id`, tail first; they stay cached until evicted. Forgets the
  // request (a preempted request is re-admitted through get_computed_blocks). No-op if unknown.
  void free(RequestId id);

  // Blocks needed to hold `num_tokens` tokens.
  int64_t blocks_for(int64_t num_tokens) const;
  int32_t num_free_blocks() const { return pool_.num_free_blocks(); }
  double usage() const { return pool_.usage(); }
  const PrefixCacheStats& stats() const { return stats_; }
  const BlockPool& pool() const { return pool_; }
  bool reset_prefix_cache() { return pool_.reset_prefix_cache(); }

  // The pool's invariants, plus for every request: each committed block is cached under the
  // request's hash for it and links to the request's previous block (live), block 0 to the
  // request's salt; its other blocks are uncached and exclusively its own. For tests.
  Status check_invariants() const;

  // Test-only: replaces H (see above) so tests can force hash collisions, e.g. a constant.
  // Only while no request is known.
  using BlockHasher = uint64_t (*)(uint64_t parent_hash, std::span<const TokenId> tokens);
  void set_block_hasher_for_testing(BlockHasher hasher);

 private:
  struct PerRequest {
    std::vector<BlockId> blocks;
    std::vector<uint64_t> hashes;  // of full blocks, computed incrementally
    int64_t num_cached_blocks = 0; // leading blocks already committed to the cache
    std::string salt;              // the salt `hashes` were computed with
  };
  void extend_hashes(PerRequest& r, std::span<const TokenId> tokens, std::string_view salt) const;

  KvCacheConfig config_;
  BlockPool pool_;
  std::unordered_map<RequestId, PerRequest> requests_;
  PrefixCacheStats stats_;
  BlockHasher hasher_ = nullptr;  // nullptr: XXH3
};

// Hash of a cache salt string (0 for an empty salt). Mixed into the root of every hash chain;
// sharing is decided by the exact salt string, not by this hash.
uint64_t cache_salt_hash(std::string_view salt);

}  // namespace pagoda
