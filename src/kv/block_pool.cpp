#include "kv/block_pool.h"

#include <algorithm>
#include <string>

#include "base/check.h"

namespace pagoda {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size) : block_size_(block_size) {
  PAGODA_CHECK(num_blocks >= 0);
  PAGODA_CHECK(block_size > 0);
  blocks_.resize(static_cast<size_t>(num_blocks) + 2);
  head_ = num_blocks;
  tail_ = num_blocks + 1;
  blocks_[head_].next = tail_;
  blocks_[tail_].prev = head_;
  // Initially every block is free, in id order, so a fresh pool hands out 0, 1, 2, ...
  for (int32_t id = 0; id < num_blocks; ++id) queue_push_back(id);
  tokens_.resize(static_cast<size_t>(num_blocks) * static_cast<size_t>(block_size));
}

int32_t BlockPool::num_blocks() const { return static_cast<int32_t>(blocks_.size()) - 2; }

int32_t BlockPool::num_free_blocks() const { return num_free_; }

double BlockPool::usage() const {
  const int32_t total = num_blocks();
  if (total == 0) return 0.0;
  return static_cast<double>(total - num_free_) / static_cast<double>(total);
}

std::optional<BlockId> BlockPool::lookup(uint64_t hash, std::span<const TokenId> tokens,
                                         BlockId parent, std::string_view salt) const {
  std::vector<BlockId> found;
  lookup_all(hash, tokens, std::span<const BlockId>(&parent, 1), salt, found);
  if (found.empty()) return std::nullopt;
  return found.front();
}

void BlockPool::lookup_all(uint64_t hash, std::span<const TokenId> tokens,
                           std::span<const BlockId> parents, std::string_view salt,
                           std::vector<BlockId>& out) const {
  PAGODA_CHECK(static_cast<int64_t>(tokens.size()) == block_size_);
  bool any_root = false;
  for (BlockId p : parents) {
    PAGODA_CHECK(p >= -1 && p < num_blocks());
    // Nothing hangs off an uncached parent (its generation moved on when it was evicted).
    PAGODA_CHECK(p == -1 || blocks_[p].cached);
    any_root = any_root || p == -1;
  }
  PAGODA_CHECK(any_root || salt.empty());
  out.clear();
  auto [first, last] = index_.equal_range(hash);
  for (auto it = first; it != last; ++it) {
    // The link and token compares are what make a 64-bit hash collision harmless: the parent is
    // a cached block the caller matched one step up the chain, in the generation it was cached
    // under, and the first block of a chain matches the salt exactly.
    const Block& b = blocks_[it->second];
    if (std::find(parents.begin(), parents.end(), b.parent) == parents.end()) continue;
    if (b.parent == -1 ? b.salt != salt : !link_live(b)) continue;
    std::span<const TokenId> stored = stored_tokens(it->second);
    if (std::equal(stored.begin(), stored.end(), tokens.begin())) out.push_back(it->second);
  }
}

void BlockPool::touch(std::span<const BlockId> blocks) {
  for (BlockId id : blocks) {
    PAGODA_CHECK(id >= 0 && id < num_blocks());
    Block& b = blocks_[id];
    if (b.ref_count == 0) queue_remove(id);
    ++b.ref_count;
  }
}

std::vector<BlockId> BlockPool::allocate(int32_t n) {
  PAGODA_CHECK(n >= 0 && n <= num_free_);
  std::vector<BlockId> out;
  out.reserve(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) {
    const int32_t id = blocks_[head_].next;
    queue_remove(id);
    // Eviction is lazy: a cached block loses its contents only when it is reused.
    if (blocks_[id].cached) evict(id);
    blocks_[id].ref_count = 1;
    out.push_back(id);
  }
  return out;
}

void BlockPool::cache_block(BlockId block, uint64_t hash, std::span<const TokenId> tokens,
                            BlockId parent, std::string_view salt) {
  PAGODA_CHECK(block >= 0 && block < num_blocks());
  PAGODA_CHECK(static_cast<int64_t>(tokens.size()) == block_size_);
  PAGODA_CHECK(parent >= -1 && parent < num_blocks() && parent != block);
  PAGODA_CHECK(parent == -1 || (blocks_[parent].cached && salt.empty()));
  const uint64_t parent_generation = parent == -1 ? 0 : blocks_[parent].generation;
  Block& b = blocks_[block];
  PAGODA_CHECK(b.ref_count > 0);
  if (b.cached) {
    PAGODA_CHECK(b.hash == hash && b.parent == parent &&
                 b.parent_generation == parent_generation && b.salt == salt);
    return;
  }
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<ptrdiff_t>(block) * block_size_);
  b.cached = true;
  b.hash = hash;
  b.parent = parent;
  b.parent_generation = parent_generation;
  b.salt.assign(salt);
  index_.emplace(hash, block);
}

void BlockPool::free_blocks(std::span<const BlockId> blocks) {
  for (BlockId id : blocks) {
    PAGODA_CHECK(id >= 0 && id < num_blocks());
    Block& b = blocks_[id];
    PAGODA_CHECK(b.ref_count > 0);
    if (--b.ref_count == 0) queue_push_back(id);
  }
}

int32_t BlockPool::ref_count(BlockId block) const {
  PAGODA_CHECK(block >= 0 && block < num_blocks());
  return blocks_[block].ref_count;
}

bool BlockPool::is_cached(BlockId block) const {
  PAGODA_CHECK(block >= 0 && block < num_blocks());
  return blocks_[block].cached;
}

std::optional<uint64_t> BlockPool::block_hash(BlockId block) const {
  PAGODA_CHECK(block >= 0 && block < num_blocks());
  if (!blocks_[block].cached) return std::nullopt;
  return blocks_[block].hash;
}

uint64_t BlockPool::generation(BlockId block) const {
  PAGODA_CHECK(block >= 0 && block < num_blocks());
  return blocks_[block].generation;
}

std::optional<BlockPool::ChainLink> BlockPool::chain_link(BlockId block) const {
  PAGODA_CHECK(block >= 0 && block < num_blocks());
  const Block& b = blocks_[block];
  if (!b.cached) return std::nullopt;
  return ChainLink{b.parent, link_live(b), b.salt};
}

bool BlockPool::link_live(const Block& b) const {
  if (b.parent == -1) return true;
  const Block& p = blocks_[b.parent];
  return p.cached && p.generation == b.parent_generation;
}

std::vector<BlockId> BlockPool::free_queue() const {
  std::vector<BlockId> out;
  out.reserve(static_cast<size_t>(num_free_));
  for (int32_t id = blocks_[head_].next; id != tail_; id = blocks_[id].next) out.push_back(id);
  return out;
}

bool BlockPool::reset_prefix_cache() {
  if (num_free_ != num_blocks()) return false;
  for (int32_t id = 0; id < num_blocks(); ++id) {
    if (blocks_[id].cached) evict(id);
  }
  PAGODA_CHECK(index_.empty());
  return true;
}

Status BlockPool::check_invariants() const {
  const int32_t n = num_blocks();
  auto fail = [](const std::string& what) { return internal_error("BlockPool: " + what); };
  if (head_ != n || tail_ != n + 1) return fail("sentinel indices moved");
  if (blocks_[head_].prev != -1 || blocks_[tail_].next != -1) return fail("sentinel outer links");
  if (num_free_ < 0 || num_free_ > n) return fail("num_free out of range: " + std::to_string(num_free_));

  // Walk the queue from the head; at most n steps may be taken before the tail is reached.
  std::vector<char> seen(static_cast<size_t>(n), 0);
  int32_t count = 0;
  int32_t prev = head_;
  for (int32_t id = blocks_[head_].next; id != tail_; id = blocks_[id].next) {
    auto at = [id] { return "free queue entry " + std::to_string(id); };
    if (id < 0 || id >= n) return fail(at() + " is not a block");
    if (seen[id]) return fail(at() + " appears twice");
    seen[id] = 1;
    if (blocks_[id].prev != prev) return fail(at() + " has a wrong prev link");
    if (!blocks_[id].in_free_queue) return fail(at() + " is not flagged in_free_queue");
    if (blocks_[id].ref_count != 0) {
      return fail(at() + " has ref_count " + std::to_string(blocks_[id].ref_count));
    }
    prev = id;
    if (++count > n) return fail("free queue has a cycle");
  }
  if (blocks_[tail_].prev != prev) return fail("tail sentinel has a wrong prev link");
  if (count != num_free_) {
    return fail("free queue holds " + std::to_string(count) + " blocks, num_free is " +
                std::to_string(num_free_));
  }

  // How many index entries name each block (linear even when every hash collides).
  std::vector<int32_t> indexed(static_cast<size_t>(n), 0);
  for (const auto& [hash, id] : index_) {
    if (id < 0 || id >= n) return fail("index names a non-block " + std::to_string(id));
    if (!blocks_[id].cached || blocks_[id].hash != hash) {
      return fail("index entry for block " + std::to_string(id) + " disagrees with the block");
    }
    ++indexed[id];
  }
  int32_t num_cached = 0;
  for (int32_t id = 0; id < n; ++id) {
    const Block& b = blocks_[id];
    auto at = [id] { return "block " + std::to_string(id); };
    if (b.ref_count < 0) return fail(at() + " has negative ref_count");
    if ((b.ref_count == 0) != static_cast<bool>(seen[id])) {
      return fail(at() + " with ref_count " + std::to_string(b.ref_count) +
                  (seen[id] ? " is" : " is not") + " in the free queue");
    }
    if (b.in_free_queue != static_cast<bool>(seen[id])) return fail(at() + " in_free_queue flag is stale");
    if (b.cached) {
      ++num_cached;
      if (indexed[id] != 1) {
        return fail(at() + " is cached but indexed " + std::to_string(indexed[id]) + " times");
      }
      if (b.parent < -1 || b.parent >= n || b.parent == id) {
        return fail(at() + " has an invalid parent " + std::to_string(b.parent));
      }
      if (b.parent == -1) {
        if (b.parent_generation != 0) return fail(at() + " is a first block with a parent generation");
      } else {
        if (!b.salt.empty()) return fail(at() + " is not a first block but keeps a salt");
        // A link records the parent's generation while it is cached; the generation only moves
        // on when the parent is evicted, so a link can never name a generation not yet reached.
        const Block& p = blocks_[b.parent];
        const uint64_t reached = p.cached ? p.generation : p.generation - 1;
        if (p.generation == 0 && !p.cached) {
          return fail(at() + " links to block " + std::to_string(b.parent) + " that was never cached");
        }
        if (b.parent_generation > reached) {
          return fail(at() + " links to a future generation of block " + std::to_string(b.parent));
        }
      }
    } else if (b.hash != 0 || b.parent != -1 || b.parent_generation != 0 || !b.salt.empty()) {
      return fail(at() + " is not cached but keeps a hash, parent link or salt");
    }
  }
  if (static_cast<int64_t>(index_.size()) != num_cached) {
    return fail("index holds " + std::to_string(index_.size()) + " entries for " +
                std::to_string(num_cached) + " cached blocks");
  }
  return Status::ok_status();
}

void BlockPool::queue_remove(int32_t id) {
  Block& b = blocks_[id];
  PAGODA_CHECK(b.in_free_queue);
  blocks_[b.prev].next = b.next;
  blocks_[b.next].prev = b.prev;
  b.prev = b.next = -1;
  b.in_free_queue = false;
  --num_free_;
}

void BlockPool::queue_push_back(int32_t id) {
  Block& b = blocks_[id];
  PAGODA_CHECK(!b.in_free_queue);
  const int32_t last = blocks_[tail_].prev;
  b.prev = last;
  b.next = tail_;
  blocks_[last].next = id;
  blocks_[tail_].prev = id;
  b.in_free_queue = true;
  ++num_free_;
}

void BlockPool::evict(int32_t id) {
  Block& b = blocks_[id];
  auto [first, last] = index_.equal_range(b.hash);
  for (auto it = first; it != last; ++it) {
    if (it->second == id) {
      index_.erase(it);
      break;
    }
  }
  b.cached = false;
  b.hash = 0;
  b.parent = -1;
  b.parent_generation = 0;
  b.salt.clear();
  // Links recorded against this incarnation of the block stop matching.
  ++b.generation;
}

std::span<const TokenId> BlockPool::stored_tokens(int32_t id) const {
  return std::span<const TokenId>(tokens_).subspan(static_cast<size_t>(id) * block_size_,
                                                   static_cast<size_t>(block_size_));
}

}  // namespace pagoda
