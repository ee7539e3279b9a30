// ForwardBatch: one forward pass over a flat batch of tokens from any number of sequences.
//
// There is no prefill or decode mode: each sequence contributes its new tokens (a whole prompt,
// a prompt chunk, or one decoded token) and the attention metadata says where its cached context
// lives. Built by the runner (or the CLI) in buffers it owns; the model only borrows them.
#pragma once

#include <cstdint>
#include <span>

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

}  // namespace pagoda
