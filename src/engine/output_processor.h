// SequenceOutput: turns one sequence's sampled tokens into text as it streams: incremental
// detokenization that only emits complete UTF-8, and stop strings found even when they span
// tokens. Text that could still turn out to be the start of a stop string is held back until it
// cannot. Engine thread only.
#pragma once

#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace pagoda {

class SequenceOutput {
 public:
  // `after_text`: the prompt holds text (not just BOS), so a SentencePiece output keeps its
  // leading space (see IncrementalDetokenizer::continue_text).
  SequenceOutput(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                 bool include_stop_str, bool skip_special, bool after_text);

  // Adds one generated token. Returns true when a stop string matched (the text is then cut
  // at the match, or after it with include_stop_str, and the sequence must end).
  bool push(TokenId id);

  // Text that is safe to show now; call finish() first when the sequence ended.
  std::string take_ready_text();

  // The sequence ended: flush held-back bytes and text (stop strings can no longer complete).
  void finish();

  const std::string& stop_string() const { return matched_stop_; }  // "" when none matched
  const std::string& text() const { return text_; }

 private:
  IncrementalDetokenizer detok_;
  std::vector<std::string> stops_;
  bool include_stop_;
  size_t max_stop_len_ = 0;
  std::string text_;
  size_t emitted_ = 0;
  bool finished_ = false;
  std::string matched_stop_;
};

}  // namespace pagoda
