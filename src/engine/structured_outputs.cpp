#include "engine/structured_outputs.h"

#include <algorithm>

namespace pagoda {

void StructuredOutputs::add(RequestId id, std::shared_ptr<const structured::TokenGrammar> grammar, bool starts_text,
                            std::optional<TokenId> after_token, std::span<const TokenId> stop_ids) {
  std::vector<int32_t> stops(stop_ids.begin(), stop_ids.end());
  Seq seq{structured::TokenMatcher(std::move(grammar), starts_text, stops), after_token, !after_token, false, {}};
  seqs_.insert_or_assign(id, std::move(seq));
}

void StructuredOutputs::fill_masks(SchedulerOutput& scheduled) {
  if (seqs_.empty()) return;
  for (ScheduledSeq& s : scheduled.seqs) {
    if (!s.sample) continue;
    auto it = seqs_.find(s.request_id);
    if (it == seqs_.end() || it->second.broken) continue;
    Seq& seq = it->second;
    const size_t rows = s.draft_tokens.size() + 1;
    // Where the constraint starts: now, or after a draft that ends the thinking.
    size_t first = 0;
    if (!seq.on) {
      auto end = std::find(s.draft_tokens.begin(), s.draft_tokens.end(), *seq.after_token);
      if (end == s.draft_tokens.end()) continue;  // thinking all step long: no masks
      first = static_cast<size_t>(end - s.draft_tokens.begin()) + 1;
    }
    seq.masks.resize(rows * words_);
    std::fill(seq.masks.begin(), seq.masks.begin() + static_cast<ptrdiff_t>(first * words_), ~uint64_t{0});
    size_t moved = 0;  // drafts the matcher took, to undo
    for (size_t j = first; j < rows; ++j) {
      const std::span<uint64_t> row(seq.masks.data() + j * words_, words_);
      seq.matcher.fill_mask(row);
      if (std::all_of(row.begin(), row.end(), [](uint64_t w) { return w == 0; })) {
        // No token can follow (a vocabulary without a stop token, or without the bytes the
        // grammar needs): the sequence goes on unconstrained rather than fail the step for all.
        seq.broken = true;
        ++num_refused_;
        std::fill(seq.masks.begin(), seq.masks.end(), ~uint64_t{0});
        break;
      }
      if (j + 1 == rows) break;
      if (!seq.matcher.accept(s.draft_tokens[j])) {
        // Draft j cannot be accepted under this mask; the rows after it are never sampled.
        for (size_t k = j + 1; k < rows; ++k) {
          std::copy(row.begin(), row.end(), seq.masks.begin() + static_cast<ptrdiff_t>(k * words_));
        }
        break;
      }
      ++moved;
    }
    seq.matcher.rollback(moved);
    s.allowed_tokens = seq.masks;
  }
}

void StructuredOutputs::accept(std::span<const RequestUpdate> updates) {
  if (seqs_.empty()) return;
  for (const RequestUpdate& u : updates) {
    auto it = seqs_.find(u.request_id);
    if (it == seqs_.end()) continue;
    Seq& seq = it->second;
    for (TokenId t : u.new_tokens) {
      if (seq.broken) break;
      if (!seq.on) {
        seq.on = t == *seq.after_token;
        continue;
      }
      if (!seq.matcher.accept(t)) {
        seq.broken = true;
        ++num_refused_;
      }
    }
  }
}

}  // namespace pagoda
