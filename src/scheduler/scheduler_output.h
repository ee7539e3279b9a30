// The messages between the scheduler and the model runner, one pair per engine step.
//
// SchedulerOutput says which tokens of which requests to compute this step; ModelRunnerOutput
// brings back the sampled tokens. Views point into the Scheduler's requests and stay valid until
// update_from_output() of the same step. Plain structs.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/types.h"
#include "kv_transfer/kv_connector_metadata.h"

namespace pagoda {

struct ScheduledSeq {
  RequestId request_id = 0;
  std::span<const TokenId> tokens;          // the tokens to compute this step
  // Speculative drafts computed after `tokens` (positions follow on), verified this step; only
  // when `tokens` is the request's last token (a decode), so sample is then true.
  std::span<const TokenId> draft_tokens;
  int64_t num_computed_tokens = 0;          // before this step: the position of tokens[0]
  std::span<const BlockId> block_table;     // every block of the request, in order
  bool sample = false;                      // the step reaches the request's last token: sample
  std::span<const TokenId> prompt_tokens;   // for penalties and prompt logprobs
  std::span<const TokenId> output_tokens;
  // A structured output's grammar masks, set by the engine after scheduling: when not empty, one
  // mask over the vocabulary (SamplingRow::allowed) for each sampled row, draft_tokens.size() + 1
  // of equal length.
  std::span<const uint64_t> allowed_tokens;
};

struct SchedulerOutput {
  std::vector<ScheduledSeq> seqs;
  int64_t num_scheduled_tokens = 0;
  std::vector<RequestId> preempted;         // preempted this step (their KV is gone)
  // The KV connector's moves for this step (kv_transfer/kv_connector_metadata.h); empty without
  // a connector. A step may carry only these (no sequences): loads still to be reported.
  KvConnectorMetadata kv_connector;

  bool empty() const { return seqs.empty() && kv_connector.empty(); }
};

struct TokenLogprobEntry {
  TokenId token = 0;
  float logprob = 0;

  bool operator==(const TokenLogprobEntry&) const = default;
};

struct SampledOutput {
  RequestId request_id = 0;
  TokenId token = 0;
  float logprob = 0;
  std::vector<TokenLogprobEntry> top_logprobs;  // when the request asked for logprobs

  bool operator==(const SampledOutput&) const = default;
};

// Logprobs of prompt tokens computed this step: entries[i] is for prompt token first_index + i
// (the first prompt token has none: nothing precedes it).
struct PromptLogprobsOutput {
  RequestId request_id = 0;
  int64_t first_index = 0;
  std::vector<SampledOutput> entries;  // token = the prompt token, with its logprob and top-N

  bool operator==(const PromptLogprobsOutput&) const = default;
};

// A request's drafts verified this step: the number scheduled and the number accepted.
struct SpecDecodeCounts {
  RequestId request_id = 0;
  int64_t num_draft_tokens = 0;
  int64_t num_accepted = 0;  // its first num_accepted drafts, the rest rejected

  bool operator==(const SpecDecodeCounts&) const = default;
};

// A request's drafts for its next step (speculative decoding), proposed by the worker after this
// step's tokens were sampled.
struct DraftTokens {
  RequestId request_id = 0;
  std::vector<TokenId> tokens;

  bool operator==(const DraftTokens&) const = default;
};

struct ModelRunnerOutput {
  // The tokens emitted, ScheduledSeq by ScheduledSeq in order, for those with sample == true:
  // one each, or for a request with drafts 1 + its num_accepted (the accepted drafts, then the
  // correction or bonus token), consecutive.
  std::vector<SampledOutput> sampled;
  std::vector<SpecDecodeCounts> spec;  // one per ScheduledSeq with drafts, same order
  std::vector<PromptLogprobsOutput> prompt_logprobs;
  std::vector<DraftTokens> drafts;     // the next step's drafts, for decoding requests that have some
  KvConnectorOutput kv_connector;      // the KV connector's report (empty without one)

  bool operator==(const ModelRunnerOutput&) const = default;
};

}  // namespace pagoda
