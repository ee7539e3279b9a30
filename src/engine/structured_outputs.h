// StructuredOutputs: the grammar masks of the engine core's constrained sequences (vLLM v1's
// StructuredOutputManager), beside the scheduler.
//
// Each constrained sequence has a TokenMatcher (structured/token_grammar.h) over its output so
// far. After the scheduler picks a step, fill_masks() gives every sampled row of a constrained
// sequence the mask of the tokens its grammar allows there (ScheduledSeq::allowed_tokens), which
// the workers' sampler applies before anything else. With speculative drafts, row j's mask is the
// grammar's after drafts [0, j): the matcher runs along the drafts and rolls back, and past a draft
// the grammar refuses, the rows repeat that draft's mask, under which the draft cannot be
// accepted, so the rows after it are never used. After the step, accept() moves each matcher over
// the tokens the sequence actually got. A preempted sequence keeps its tokens, so its matcher
// stays as it is.
//
// A reasoning model's constraint starts after its end-of-thinking token (`after_token`): until
// then, a sequence's rows have no mask.
//
// Single-threaded, like the engine core that owns it.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "base/types.h"
#include "scheduler/scheduler.h"
#include "scheduler/scheduler_output.h"
#include "structured/token_grammar.h"

namespace pagoda {

class StructuredOutputs {
 public:
  // `words`: the length of a mask (the model's vocabulary in 64-bit words); every grammar added
  // must be over a vocabulary of that size.
  explicit StructuredOutputs(size_t words) : words_(words) {}

  // `after_token`: the constraint starts after the output's first such token (set by whoever
  // knows the model thinks first: a reasoning parser with thinking on). `starts_text` and
  // `stop_ids`: TokenMatcher's.
  void add(RequestId id, std::shared_ptr<const structured::TokenGrammar> grammar, bool starts_text,
           std::optional<TokenId> after_token, std::span<const TokenId> stop_ids);
  void remove(RequestId id) { seqs_.erase(id); }
  bool empty() const { return seqs_.empty(); }

  void fill_masks(SchedulerOutput& scheduled);
  void accept(std::span<const RequestUpdate> updates);

  // Sequences whose constraint was dropped: a sampled token the matcher refused (never, unless a
  // mask was not applied), or a mask that allowed nothing (a vocabulary with no stop token, or
  // without the bytes the grammar needs); they go on unconstrained. For tests and a warning.
  int64_t num_refused() const { return num_refused_; }

 private:
  struct Seq {
    structured::TokenMatcher matcher;
    std::optional<TokenId> after_token;
    bool on = true;       // the constraint applies (the thinking has ended)
    bool broken = false;  // a sampled token was refused: no more masks
    std::vector<uint64_t> masks;
  };
  size_t words_;
  std::unordered_map<RequestId, Seq> seqs_;
  int64_t num_refused_ = 0;
};

}  // namespace pagoda
