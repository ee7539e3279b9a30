#include "tokenizer/bpe_merges.h"

#include <algorithm>
#include <queue>

namespace pagoda {

void BpeMerges::add(TokenId left, TokenId right, TokenId merged, int32_t rank) {
  map_.emplace(key(left, right), Entry{rank, merged});
}

const BpeMerges::Entry* BpeMerges::find(TokenId left, TokenId right) const {
  auto it = map_.find(key(left, right));
  return it == map_.end() ? nullptr : &it->second;
}

std::vector<std::pair<TokenId, TokenId>> BpeMerges::pairs_by_rank() const {
  std::vector<std::pair<int32_t, uint64_t>> ranked;
  ranked.reserve(map_.size());
  for (const auto& [k, e] : map_) ranked.emplace_back(e.rank, k);
  std::sort(ranked.begin(), ranked.end());
  std::vector<std::pair<TokenId, TokenId>> pairs;
  pairs.reserve(ranked.size());
  for (const auto& [rank, k] : ranked) {
    pairs.emplace_back(static_cast<TokenId>(k >> 32), static_cast<TokenId>(k & 0xFFFFFFFFu));
  }
  return pairs;
}

void BpeMerges::apply(std::vector<TokenId>& symbols) const {
  const size_t n = symbols.size();
  if (n < 2 || map_.empty()) return;

  // A candidate merge of the symbol at `pos` with its right neighbour. Positions are the
  // original indices of the left symbols, so they stay ordered left to right as merges happen.
  struct Candidate {
    int32_t rank;
    int32_t pos;
    TokenId merged;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  std::vector<int32_t> prev(n), next(n);
  std::vector<bool> alive(n, true);
  for (size_t i = 0; i < n; ++i) {
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  const auto consider = [&](int32_t pos) {
    if (pos < 0) return;
    const int32_t right = next[static_cast<size_t>(pos)];
    if (right < 0) return;
    if (const Entry* e = find(symbols[static_cast<size_t>(pos)], symbols[static_cast<size_t>(right)])) {
      heap.push({e->rank, pos, e->merged});
    }
  };
  for (size_t i = 0; i + 1 < n; ++i) consider(static_cast<int32_t>(i));

  while (!heap.empty()) {
    const Candidate top = heap.top();
    heap.pop();
    const auto pos = static_cast<size_t>(top.pos);
    if (!alive[pos] || next[pos] < 0) continue;
    const auto right = static_cast<size_t>(next[pos]);
    // The pair may have changed since this candidate was queued; it is still valid only if the
    // current pair merges the same way.
    const Entry* e = find(symbols[pos], symbols[right]);
    if (e == nullptr || e->rank != top.rank || e->merged != top.merged) continue;
    symbols[pos] = top.merged;
    alive[right] = false;
    next[pos] = next[right];
    if (next[pos] >= 0) prev[static_cast<size_t>(next[pos])] = top.pos;
    consider(prev[pos]);
    consider(top.pos);
  }

  size_t out = 0;
  for (size_t i = 0; i < n; ++i) {
    if (alive[i]) symbols[out++] = symbols[i];
  }
  symbols.resize(out);
}

}  // namespace pagoda
