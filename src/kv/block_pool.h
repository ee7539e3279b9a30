// BlockPool: the bookkeeping of the paged KV cache's blocks (no tensors): reference counts, the
// free queue in eviction order, and the prefix-cache index from block hash to block.
//
// Block records live in one vector; the free queue is an intrusive doubly linked list threaded
// through them by index (O(1) pop-front, push-back and remove-from-middle). A free block may still
// be cached (ref_count 0, hash kept): it is reusable by a prefix hit until it reaches the head of
// the queue and is popped for new data, at which point it is evicted.
//
// A hit is exact by construction, whatever the hashes do: a cached block records its token ids,
// its parent (the cached block holding the previous block of its chain, or -1 for a chain's
// first block) together with that parent's generation, and, for a first block, the exact cache
// salt. A block's generation is bumped every time its cached contents are dropped, so a link to
// a parent that has since been evicted and reused for other data no longer matches. lookup()
// requires the hash, the tokens and the link (or salt) to match, so by induction over the chain a
// hit holds exactly the salted token prefix asked for, even when crafted prompts collide on the
// 64-bit hashes. Used by the engine thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "base/types.h"

namespace pagoda {

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const;
  int32_t block_size() const { return block_size_; }
  // Blocks in the free queue (never used, or cached with ref_count 0).
  int32_t num_free_blocks() const;
  // Fraction of blocks in use (ref_count > 0), in [0, 1].
  double usage() const;

  // The cached block holding exactly `tokens` (block_size ids) under `hash` whose parent is
  // `parent` (a cached block, as it is now) or, for parent == -1, a first block cached under
  // exactly `salt`; nullopt if there is none. `salt` must be empty when parent != -1.
  // Does not change any reference count.
  std::optional<BlockId> lookup(uint64_t hash, std::span<const TokenId> tokens, BlockId parent,
                                std::string_view salt = {}) const;
  // Every such block whose parent is any of `parents` (-1 or cached blocks; `salt` is compared
  // for -1 only and must be empty unless `parents` holds -1), in index order, into `out` (which
  // is cleared first). Duplicates (the same salted prefix cached in several blocks, as when two
  // requests commit it independently) each have children of their own: a walk down a chain that
  // follows all of them finds the longest cached prefix.
  void lookup_all(uint64_t hash, std::span<const TokenId> tokens, std::span<const BlockId> parents,
                  std::string_view salt, std::vector<BlockId>& out) const;

  // Takes a reference on each block (a prefix hit): a block whose count was 0 leaves the free
  // queue. The caller must have checked there is room (see KvCacheManager::allocate_slots).
  void touch(std::span<const BlockId> blocks);

  // Pops `n` blocks from the head of the free queue with ref_count 1, evicting any cached
  // contents. Requires n <= num_free_blocks() (a bug otherwise).
  std::vector<BlockId> allocate(int32_t n);

  // Records that `block` (in use) now holds exactly `tokens` with chained hash `hash`, following
  // `parent` (a cached block other than `block`; its current generation is recorded), or, for
  // parent == -1, as the first block of a chain salted with `salt` (empty when parent != -1).
  // Makes it findable by lookup(). A block already cached is left as it is (it must be cached
  // under the same hash, parent link and salt; anything else is a bug).
  void cache_block(BlockId block, uint64_t hash, std::span<const TokenId> tokens, BlockId parent,
                   std::string_view salt = {});

  // Drops one reference from each block, in the order given; blocks reaching 0 are appended to
  // the tail of the free queue, keeping their cached contents (callers pass tail blocks first).
  void free_blocks(std::span<const BlockId> blocks);

  int32_t ref_count(BlockId block) const;
  bool is_cached(BlockId block) const;
  // The hash a cached block is indexed under; nullopt when the block is not cached.
  std::optional<uint64_t> block_hash(BlockId block) const;
  // How many times the block's cached contents have been dropped (evicted or reset).
  uint64_t generation(BlockId block) const;
  // A cached block's place in its chain: its parent (-1 for a first block), whether that link is
  // still live (the parent is cached in the generation the link recorded; always true for a
  // first block), and a first block's salt (a view into the pool, valid until the block is next
  // evicted). nullopt when the block is not cached.
  struct ChainLink {
    BlockId parent = -1;
    bool live = true;
    std::string_view salt;
  };
  std::optional<ChainLink> chain_link(BlockId block) const;

  // The free queue, head (next to be popped) first. O(num_blocks); for tests and debugging.
  std::vector<BlockId> free_queue() const;

  // Forgets every cached block; only possible (returns true) when no block is in use.
  bool reset_prefix_cache();

  // Checks every invariant (ref counts >= 0, free queue holds exactly the ref_count-0 blocks,
  // once each, links consistent, hash index consistent with block records, chain links name
  // blocks and never a future generation, only first blocks keep a salt). For tests.
  Status check_invariants() const;

 private:
  struct Block {
    int32_t ref_count = 0;
    int32_t prev = -1, next = -1;  // free-queue links (indices; sentinels at the end)
    bool in_free_queue = false;
    bool cached = false;
    uint64_t hash = 0;
    uint64_t generation = 0;         // bumped whenever cached contents are dropped
    // Cached blocks only (reset to -1 / 0 / empty otherwise):
    int32_t parent = -1;             // the previous block of the chain, -1 for a first block
    uint64_t parent_generation = 0;  // the parent's generation when this block was cached
    std::string salt;                // a first block's exact cache salt
  };
  bool link_live(const Block& b) const;
  void queue_remove(int32_t id);
  void queue_push_back(int32_t id);
  void evict(int32_t id);
  std::span<const TokenId> stored_tokens(int32_t id) const;

  int32_t block_size_;
  std::vector<Block> blocks_;       // num_blocks + 2 sentinels (head, tail)
  int32_t head_, tail_;             // sentinel indices
  int32_t num_free_ = 0;
  std::vector<TokenId> tokens_;     // [num_blocks, block_size] ids of cached blocks
  std::unordered_multimap<uint64_t, int32_t> index_;  // hash -> cached block
};

}  // namespace pagoda
