// TokenVocabulary: a model's tokens as the bytes each adds to the output text, sorted into a trie,
// for computing which tokens a grammar allows (token_grammar.h).
//
// The bytes are the detokenizer's (Tokenizer::token_bytes): a byte-fallback token is its byte, a
// SentencePiece '▁' is a space, a byte-level BPE token its bytes. Special tokens (BOS, <|im_end|>)
// and ids with no bytes add nothing a grammar could match, so they are never allowed, except the
// stop tokens, which are allowed where the grammar can end.
//
// Immutable; build one per model and share it (thread-safe).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace pagoda {
class Tokenizer;
}

namespace pagoda::structured {

class TokenVocabulary {
 public:
  // `bytes[id]` is what token `id` adds to the text, "" for an id no grammar matches (special,
  // unused). `stop_ids` end generation (ids outside bytes' range are dropped).
  // `strips_leading_space`: the output's first byte is dropped when it is a space
  // (Tokenizer::decode_strips_leading_space, for an output that starts the text).
  TokenVocabulary(std::vector<std::string> bytes, std::vector<int32_t> stop_ids, bool strips_leading_space);

  // A tokenizer's tokens over a model's `vocab_size` ids (the logits' length, which may differ
  // from the tokenizer's: ids past either have no bytes).
  static std::shared_ptr<const TokenVocabulary> of(const Tokenizer& tokenizer, int64_t vocab_size);

  // The ids are 0..size()-1.
  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  // The 64-bit words of a mask over the ids (bit id % 64 of word id / 64).
  size_t mask_words() const { return (bytes_.size() + 63) / 64; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool strips_leading_space() const { return strips_leading_space_; }

  // The ids with bytes, sorted by their bytes (a prefix first).
  std::span<const int32_t> sorted() const { return sorted_; }

  // A trie over sorted(), its nodes in depth-first order, node 0 the root (the empty prefix). A
  // node stands for one prefix: the tokens in sorted()[lo, hi) start with it, those in [lo, mid)
  // are exactly it, and its subtree ends before node `next` (the first child, if any, is the
  // next node).
  struct TrieNode {
    int32_t lo = 0, mid = 0, hi = 0;
    int32_t next = 0;
    int32_t depth = 0;  // the prefix's length
    uint8_t byte = 0;   // its last byte
  };
  std::span<const TrieNode> trie() const { return trie_; }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> stop_ids_;
  bool strips_leading_space_;
  std::vector<int32_t> sorted_;
  std::vector<TrieNode> trie_;
};

}  // namespace pagoda::structured
