#include "speculative/ngram_proposer.h"

#include <algorithm>
#include <string>

namespace pagoda {

Status NgramProposerConfig::validate() const {
  if (num_speculative_tokens < 1 || num_speculative_tokens > kMaxSpeculativeTokens) {
    return invalid_argument("num_speculative_tokens must be in [1, " + std::to_string(kMaxSpeculativeTokens) +
                                    "], got " + std::to_string(num_speculative_tokens));
  }
  if (prompt_lookup_min < 1 || prompt_lookup_min > kMaxLookup) {
    return invalid_argument("prompt_lookup_min must be in [1, " + std::to_string(kMaxLookup) + "], got " +
                                    std::to_string(prompt_lookup_min));
  }
  if (prompt_lookup_max < prompt_lookup_min || prompt_lookup_max > kMaxLookup) {
    return invalid_argument("prompt_lookup_max must be in [prompt_lookup_min, " + std::to_string(kMaxLookup) +
                                    "], got " + std::to_string(prompt_lookup_max));
  }
  return Status();
}

std::vector<TokenId> NgramProposer::propose(std::span<const TokenId> tokens, int64_t max_drafts) const {
  const int64_t len = static_cast<int64_t>(tokens.size());
  const int64_t k = std::min(config_.num_speculative_tokens, max_drafts);
  if (k < 1 || len < config_.prompt_lookup_min + 1) return {};
  // For each earlier end position e (< len - 1), how many tokens ending at e equal the tail,
  // up to prompt_lookup_max. The longest such run (at least prompt_lookup_min) wins, the
  // earliest end among equals; one pass, O(len x prompt_lookup_max).
  int64_t best_n = 0, best_end = -1;
  for (int64_t e = config_.prompt_lookup_min - 1; e < len - 1; ++e) {
    int64_t n = 0;
    const int64_t limit = std::min(config_.prompt_lookup_max, e + 1);
    while (n < limit && tokens[e - n] == tokens[len - 1 - n]) ++n;
    if (n > best_n) {
      best_n = n;
      best_end = e;
      if (n == config_.prompt_lookup_max) break;  // no later match can be longer or earlier
    }
  }
  if (best_n < config_.prompt_lookup_min) return {};
  const int64_t from = best_end + 1, to = std::min(len, from + k);
  return std::vector<TokenId>(tokens.begin() + from, tokens.begin() + to);
}

std::vector<std::vector<TokenId>> NgramProposer::propose(std::span<const ProposalRequest> requests) {
  std::vector<std::vector<TokenId>> drafts(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].max_drafts > 0) drafts[i] = propose(requests[i].tokens, requests[i].max_drafts);
  }
  return drafts;
}

std::string NgramProposer::describe() const {
  return "ngram, up to " + std::to_string(config_.num_speculative_tokens) + " draft tokens per step from prompt lookup of " +
         std::to_string(config_.prompt_lookup_min) + " to " + std::to_string(config_.prompt_lookup_max) + " tokens";
}

}  // namespace pagoda
