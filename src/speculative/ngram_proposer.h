// NgramProposer: speculative decoding's draft-free proposer (vLLM's `ngram` method, "prompt lookup
// decoding"). It looks for the tail of a sequence earlier in the same sequence (prompt and output)
// and proposes the tokens that followed it there: summaries, edits and code often copy their
// prompt, and each accepted proposal is a token that cost no forward pass of its own.
//
// Matching rule (vLLM's): the longest n in [prompt_lookup_min, prompt_lookup_max] such that the
// last n tokens occur earlier in the sequence (the tail itself does not count; an earlier match
// may overlap it), and of the matches of that length the earliest; the proposal is the up to
// num_speculative_tokens tokens after it. No match, or a sequence shorter than prompt_lookup_min:
// no proposal.
//
// Stateless apart from its configuration: the one-sequence propose() is const and thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "speculative/proposer.h"

namespace pagoda {

struct NgramProposerConfig {
  int64_t num_speculative_tokens = 0;  // k, at most kMaxSpeculativeTokens
  int64_t prompt_lookup_min = 0;       // 1 <= min <= max
  int64_t prompt_lookup_max = 0;

  static constexpr int64_t kMaxSpeculativeTokens = 128;  // vLLM's cap
  static constexpr int64_t kMaxLookup = 1024;

  // invalid_argument naming the field when one is out of range.
  Status validate() const;
};

class NgramProposer : public Proposer {
 public:
  explicit NgramProposer(NgramProposerConfig config) : config_(config) {}

  // Proposer: each decoding request's drafts from its own tokens.
  std::vector<std::vector<TokenId>> propose(std::span<const ProposalRequest> requests) override;
  std::string describe() const override;

  // Up to min(num_speculative_tokens, max_drafts) tokens for a sequence whose tokens (prompt then
  // output, no drafts) are `tokens`; empty when nothing matches. max_drafts < 1 gives none (the
  // caller passes what the context limit leaves room for).
  std::vector<TokenId> propose(std::span<const TokenId> tokens, int64_t max_drafts) const;

  const NgramProposerConfig& config() const { return config_; }

 private:
  NgramProposerConfig config_;
};

}  // namespace pagoda
