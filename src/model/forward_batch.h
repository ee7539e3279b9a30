// ForwardBatch: one forward pass over a flat batch of tokens from any number of sequences.
//
// There is no prefill or decode mode: each sequence contributes its new tokens (a whole prompt,
// a prompt chunk, or one decoded token) and the attention metadata says where its cached context
// lives. Built by the runner (or the CLI) in buffers it owns; the model only borrows them.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "backend/kernels.h"
#include "base/types.h"

namespace pagoda {

struct ForwardBatch {
  std::span<const TokenId> token_ids;    // [num_tokens]
  std::span<const int32_t> positions;    // [num_tokens] position of each token in its sequence
  std::span<const int64_t> slot_mapping; // [num_tokens] KV cache slot each token's K/V goes to
  std::span<const AttentionSeq> seqs;    // rows of each sequence, in order, covering all tokens

  int64_t num_tokens() const { return static_cast<int64_t>(token_ids.size()); }
};

// The buffers behind a ForwardBatch, reused from pass to pass: each sequence's new tokens with
// their positions and KV slots (from its block table), and where its rows are.
struct ForwardBatchBuffers {
  std::vector<TokenId> token_ids;
  std::vector<int32_t> positions;
  std::vector<int64_t> slot_mapping;
  std::vector<AttentionSeq> seqs;

  void clear() {
    token_ids.clear();
    positions.clear();
    slot_mapping.clear();
    seqs.clear();
  }
  // Appends a sequence's tokens `first` then `second` at positions first_pos.. (its context
  // then holds first_pos + both); the block table must cover them (the caller checks).
  // Returns the row of its first token.
  int64_t add_sequence(std::span<const TokenId> first, std::span<const TokenId> second, int64_t first_pos,
                       std::span<const BlockId> block_table, int64_t block_size) {
    const int64_t start = static_cast<int64_t>(token_ids.size());
    const int64_t n = static_cast<int64_t>(first.size() + second.size());
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = first_pos + j;
      const size_t i = static_cast<size_t>(j);
      token_ids.push_back(i < first.size() ? first[i] : second[i - first.size()]);
      positions.push_back(static_cast<int32_t>(pos));
      slot_mapping.push_back(static_cast<int64_t>(block_table[static_cast<size_t>(pos / block_size)]) * block_size +
                             pos % block_size);
    }
    seqs.push_back(AttentionSeq{start, n, first_pos + n, block_table.data()});
    return start;
  }
  ForwardBatch batch() const { return ForwardBatch{token_ids, positions, slot_mapping, seqs}; }
  bool empty() const { return token_ids.empty(); }
};

}  // namespace pagoda
