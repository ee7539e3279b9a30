#include "structured/token_vocabulary.h"

#include <algorithm>

#include "tokenizer/tokenizer.h"

namespace pagoda::structured {

TokenVocabulary::TokenVocabulary(std::vector<std::string> bytes_by_id, std::vector<int32_t> stop_ids,
                                 bool strips_leading_space)
    : bytes_(std::move(bytes_by_id)), strips_leading_space_(strips_leading_space) {
  for (int32_t id : stop_ids) {
    if (id >= 0 && id < size() && std::find(stop_ids_.begin(), stop_ids_.end(), id) == stop_ids_.end()) {
      stop_ids_.push_back(id);
    }
  }
  for (int32_t id = 0; id < size(); ++id) {
    if (!bytes_[static_cast<size_t>(id)].empty()) sorted_.push_back(id);
  }
  std::stable_sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) { return bytes(a) < bytes(b); });

  // Depth-first, one token at a time: the open path is the previous token's prefixes; the nodes
  // past what this token shares with it close, and this token's remaining prefixes open.
  const int32_t n = static_cast<int32_t>(sorted_.size());
  trie_.push_back(TrieNode{0, 0, n, 0, 0, 0});
  std::vector<int32_t> path{0};  // path[d]: the open node of depth d
  const std::string* prev = nullptr;
  auto close_to = [&](size_t depth, int32_t at) {
    while (path.size() > depth + 1) {
      TrieNode& node = trie_[static_cast<size_t>(path.back())];
      node.hi = at;
      node.next = static_cast<int32_t>(trie_.size());
      path.pop_back();
    }
  };
  for (int32_t i = 0; i < n; ++i) {
    const std::string& s = bytes(sorted_[static_cast<size_t>(i)]);
    size_t common = 0;
    if (prev) {
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    }
    close_to(common, i);
    for (size_t d = common + 1; d <= s.size(); ++d) {
      path.push_back(static_cast<int32_t>(trie_.size()));
      trie_.push_back(TrieNode{i, i, i, 0, static_cast<int32_t>(d), static_cast<uint8_t>(s[d - 1])});
    }
    trie_[static_cast<size_t>(path.back())].mid = i + 1;
    prev = &s;
  }
  close_to(0, n);
  trie_[0].next = static_cast<int32_t>(trie_.size());
}

std::shared_ptr<const TokenVocabulary> TokenVocabulary::of(const Tokenizer& tokenizer, int64_t vocab_size) {
  std::vector<std::string> bytes(static_cast<size_t>(std::max<int64_t>(vocab_size, 0)));
  const int64_t known = std::min(vocab_size, tokenizer.vocab_size());
  for (int64_t id = 0; id < known; ++id) {
    if (!tokenizer.is_special(static_cast<TokenId>(id))) {
      bytes[static_cast<size_t>(id)] = tokenizer.token_bytes(static_cast<TokenId>(id));
    }
  }
  std::vector<int32_t> stops;
  for (TokenId id : tokenizer.stop_ids()) stops.push_back(static_cast<int32_t>(id));
  return std::make_shared<const TokenVocabulary>(std::move(bytes), std::move(stops),
                                                 tokenizer.decode_strips_leading_space());
}

}  // namespace pagoda::structured
