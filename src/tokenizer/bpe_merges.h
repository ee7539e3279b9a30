// BpeMerges: the merge table of a rank-ordered BPE model (Hugging Face tokenizer.json, GGUF
// "gpt2" merges) and the merge loop itself.
//
// apply() repeatedly merges the adjacent pair with the lowest rank (leftmost among equal ranks)
// until no listed pair remains, as Hugging Face's BPE does. It keeps the symbols in a linked
// list and candidate pairs in a heap, so a word of n symbols costs O(n log n), not O(n^2).
// Immutable after loading: apply() is thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/types.h"

namespace pagoda {

class BpeMerges {
 public:
  // Records that `left right` merges into `merged` with priority `rank` (lower merges first).
  // When a pair is listed twice the first (lower-ranked) entry is kept.
  void add(TokenId left, TokenId right, TokenId merged, int32_t rank);
  void reserve(size_t n) { map_.reserve(n); }
  size_t size() const { return map_.size(); }

  // The listed pairs, lowest rank first (to export the vocabulary, e.g. as GGUF merges).
  std::vector<std::pair<TokenId, TokenId>> pairs_by_rank() const;

  // Merges `symbols` in place.
  void apply(std::vector<TokenId>& symbols) const;

 private:
  struct Entry {
    int32_t rank;
    TokenId merged;
  };
  static uint64_t key(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Entry* find(TokenId left, TokenId right) const;

  std::unordered_map<uint64_t, Entry> map_;
};

}  // namespace pagoda
