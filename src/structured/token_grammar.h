// Token masks: which tokens of a vocabulary a grammar allows next, exactly, at a cost per step that
// does not grow with the vocabulary's walk.
//
// TokenGrammar (one per grammar and vocabulary, built once and shared) walks the vocabulary's trie
// from every byte-set position of the grammar with nothing known below it (StateSpace::at), and
// sorts each token into one of three lists:
//   - accepted: the token's bytes all match without the position's rule ending; allowed in every
//     context the position appears in;
//   - rejected: its bytes fail before the rule could end; never allowed (kept by leaving it out);
//   - uncertain: the rule can end partway through the token, and what is left (its suffix) must
//     match whatever follows the rule in the real context. Suffixes whose first byte can follow
//     the rule nowhere in the grammar (FOLLOW sets) are rejected here already.
// TokenMatcher (one per sequence) keeps the sequence's parse state. Its mask is the union, over
// the state's open stacks, of each top position's accepted tokens and of the uncertain tokens whose
// suffix matches after the stack's rule ends (StateSpace::after); that last check is remembered
// per stack, so a step that stays in the same place (a string's characters) costs a union of
// bitsets.
//
// Exact: a token is allowed iff its bytes continue the text so far to a prefix of some match (and
// every such prefix can be completed: GrammarBuilder::build drops what cannot). Stop tokens are
// allowed iff the text so far is a whole match. Special tokens and tokens without bytes never are.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "structured/grammar_matcher.h"
#include "structured/token_vocabulary.h"

namespace pagoda::structured {

class TokenGrammar {
 public:
  // Fails when the grammar has more than kMaxItems items, when walking the vocabulary would take
  // more than `max_work` trie steps, or when compiling runs past kMaxSeconds (a grammar that large
  // is refused rather than stalling the caller).
  static Result<std::shared_ptr<const TokenGrammar>> compile(std::shared_ptr<const CompiledGrammar> grammar,
                                                             std::shared_ptr<const TokenVocabulary> vocabulary,
                                                             int64_t max_work = kDefaultMaxWork);
  static constexpr int64_t kDefaultMaxWork = int64_t{1} << 28;
  static constexpr int32_t kMaxItems = 1 << 20;
  static constexpr double kMaxSeconds = 5.0;

  const std::shared_ptr<const CompiledGrammar>& grammar() const { return grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }

  // What the tokens do from one byte-set position (see the file comment).
  struct Position {
    std::vector<uint64_t> accepted_bits;  // a mask (TokenVocabulary::mask_words) when many are accepted,
    std::vector<int32_t> accepted_ids;    // else the ids
    std::vector<std::string> suffixes;    // distinct
    std::vector<int32_t> uncertain_ids;   // each with the suffix it must match after the rule ends
    std::vector<int32_t> uncertain_suffixes;
  };
  // (Only the byte-set positions of rules the root reaches have one.)
  bool has_position(int32_t pos) const { return position_of_[static_cast<size_t>(pos)] >= 0; }
  const Position& position(int32_t pos) const { return positions_[static_cast<size_t>(position_of_[static_cast<size_t>(pos)])]; }

  struct Stats {
    int64_t positions = 0, accepted = 0, uncertain = 0, suffixes = 0, work = 0;
  };
  const Stats& stats() const { return stats_; }

 private:
  TokenGrammar() = default;

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::shared_ptr<const TokenVocabulary> vocabulary_;
  std::vector<int32_t> position_of_;  // by grammar position: index into positions_, -1 when none
  std::vector<Position> positions_;
  Stats stats_;
};

class TokenMatcher {
 public:
  // `starts_text`: the output is the start of the text (no prompt text before it), so that a
  // tokenizer that drops the text's leading space (TokenVocabulary::strips_leading_space) drops
  // it from the first token here too, as the detokenizer will. `stop_ids`: the tokens that end
  // this output, besides the vocabulary's (a request's stop_token_ids).
  TokenMatcher(std::shared_ptr<const TokenGrammar> grammar, bool starts_text, std::span<const int32_t> stop_ids = {});

  // Sets in `mask` (TokenVocabulary::mask_words words) the bits of the tokens allowed next, and
  // clears the others. After a stop token only stop tokens are (a request that ignores EOS goes
  // on emitting them).
  void fill_mask(std::span<uint64_t> mask);
  // Advances over `token` if it is allowed (what fill_mask would set): true; else false, and the
  // state is unchanged. A stop token is allowed where the text can end, and ends the matcher.
  bool accept(int32_t token);
  // Undoes the last `tokens` accepted tokens (at most accepted()), e.g. rejected draft tokens.
  void rollback(size_t tokens);
  size_t accepted() const { return history_.size() - 1; }

  // Whether the text so far is a whole match (a stop token is allowed).
  bool can_end() const { return space_.ended(state()); }
  // Whether a stop token was accepted, or the match is whole and nothing can follow.
  bool finished() const { return stopped_ || (can_end() && !space_.can_continue(state())); }

 private:
  int32_t state() const { return history_.back(); }
  // The bytes `token` adds here (the first token may lose its leading space).
  std::string_view token_text(int32_t token) const;
  // The uncertain tokens of stack `node` that its context accepts (remembered per node).
  const std::vector<int32_t>& context_accepted(int32_t node);

  std::shared_ptr<const TokenGrammar> grammar_;
  const TokenVocabulary* vocab_;
  StateSpace space_;
  bool strip_first_space_;
  std::vector<int32_t> stop_ids_;  // sorted
  bool stopped_ = false;
  std::vector<int32_t> history_;  // the state before any token, then after each
  size_t stop_at_ = 0;            // history_.size() when the stop token was accepted
  std::unordered_map<int32_t, std::vector<int32_t>> context_accepted_;
  std::vector<int32_t> stacks_;  // fill_mask()'s copy of the state's stacks
};

}  // namespace pagoda::structured
