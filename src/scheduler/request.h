// Request: one sequence's state as the scheduler sees it: its tokens, how many of them have KV
// in the cache, its place in the queues, and the most tokens it may reach. No tensors, no text,
// no stop rules: whether a sequence stops is decided in one place, the engine frontend's output
// processor (engine/output_processor.h), which then finishes it.
// Owned by the Scheduler; touched only on the engine thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "base/types.h"
#include "kv_transfer/kv_transfer_params.h"

namespace pagoda {

// kWaitingForKv: admitted with blocks, waiting for a KV connector to load some of its tokens
// (kv_transfer/kv_connector.h); none of its tokens is scheduled meanwhile.
enum class RequestStatus { kWaiting, kWaitingForKv, kRunning, kPreempted, kFinished };

// kError: the engine failed while the request ran (the request itself may have been fine).
enum class FinishReason { kNone, kStop, kLength, kAbort, kError };
const char* finish_reason_name(FinishReason r);  // "stop", "length", "abort", "error", ""

struct Request {
  RequestId id = 0;
  std::vector<TokenId> prompt_tokens;
  std::vector<TokenId> output_tokens;
  std::vector<TokenId> all_tokens;        // prompt + output, what the KV cache must hold
  int64_t max_tokens = 16;                // output tokens at most: what admission must make room for
  int64_t priority = 0;                   // lower is scheduled first under the priority policy
  uint64_t arrival_seq = 0;               // submission order, for FCFS and ties
  std::string cache_salt;                 // isolates prefix-cache sharing, exactly ("" = none)
  bool use_prefix_cache = true;           // off for requests that need every prompt row computed
  // Disaggregated prefill (kv_transfer/kv_transfer_params.h): a prefill instance's request keeps
  // its prompt's KV for a decode instance; a decode instance's loads it.
  std::optional<KvTransferParams> kv_transfer;

  RequestStatus status = RequestStatus::kWaiting;
  int64_t num_computed_tokens = 0;        // tokens whose K/V are in the cache
  int64_t num_cached_tokens = -1;         // prefix-cache hit at first admission (-1: not yet)
  int64_t num_external_tokens = 0;        // tokens a KV connector loads (or loaded) at admission
  int64_t num_preemptions = 0;
  std::vector<TokenId> spec_tokens;            // drafts proposed for the next step
  std::vector<TokenId> scheduled_spec_tokens;  // drafts of the step in flight (until its update)
  // Steps scheduled with this request whose output has not come back yet (more than one only
  // under pipeline parallelism, where several batches are in flight).
  int64_t steps_in_flight = 0;

  int64_t num_tokens() const { return static_cast<int64_t>(all_tokens.size()); }
  int64_t num_output_tokens() const { return static_cast<int64_t>(output_tokens.size()); }
  bool finished() const { return status == RequestStatus::kFinished; }
};

}  // namespace pagoda
