// Proposer: what speculative decoding asks of a drafter. After each engine step the engine hands
// it every running request (its tokens so far and how far the target's KV cache reaches) and gets
// back draft tokens for the decoding ones; the target verifies them in its next step.
//
// A proposer may keep state per request (a draft model keeps its own KV cache): forget() is
// called when the target drops a request's KV (finished, aborted, preempted), and a request whose
// drafts were partly rejected comes back with tokens that differ from what the proposer guessed
// past some point: the proposer compares and rolls back itself. Heads that read the target's
// hidden states (EAGLE, MTP) would get them through ProposalRequest; no such weights are at hand
// to test, so nothing carries them yet.
//
// Engine thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/types.h"

namespace pagoda {

struct ProposalRequest {
  RequestId id = 0;
  std::span<const TokenId> tokens;   // prompt + output so far, no drafts
  int64_t num_computed_tokens = 0;   // the target's KV holds tokens[0, num_computed_tokens)
  // Most drafts wanted (what the context limit and max_tokens leave room for, and at most
  // num_speculative_tokens). 0 while the request is still in prefill (num_computed_tokens <
  // tokens.size() - 1) or has no room: a stateful proposer keeps in step and proposes nothing.
  int64_t max_drafts = 0;
  std::string_view cache_salt;       // the request's prefix-cache isolation ("" = none)
};

class Proposer {
 public:
  virtual ~Proposer() = default;

  // Drafts for each request, same order (empty where none). Requests the proposer has not seen
  // before are new; those it knows but that are missing this call merely did not run.
  virtual std::vector<std::vector<TokenId>> propose(std::span<const ProposalRequest> requests) = 0;

  // The target no longer holds request `id`'s KV (finished, aborted or preempted): drop its
  // state. No-op for an unknown id.
  virtual void forget(RequestId id) { (void)id; }

  // One line for the start-up log: "ngram, ..." / "draft model PATH, ...".
  virtual std::string describe() const = 0;
};

}  // namespace pagoda
