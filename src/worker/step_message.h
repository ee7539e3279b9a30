// StepMessage: one engine step as owned plain data that serialises to bytes, what the scheduler's
// rank sends to every worker (vLLM v1's SchedulerOutput with NewRequestData and CachedRequestData).
//
// A worker keeps each request's state between steps (its tokens, block table and sampling
// parameters with their generator), so a message carries a request in full only the first time
// it is scheduled, and afterwards only what changed: the tokens sampled since, the blocks added,
// and, after a preemption, the new block table. StepEncoder (rank 0) writes these deltas from the
// scheduler's SchedulerOutput; Worker (worker.h) applies them.
//
// ModelRunnerOutput (scheduler/scheduler_output.h) travels back the same way: serialize_output /
// deserialize_output. Decoding checks every length against the bytes received (a corrupted or
// short message is data_loss, never an out-of-bounds read); what the values mean (known ids, token
// and block ranges) the Worker checks against its state.
//
// Plain values, thread-compatible.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "base/types.h"
#include "kv_transfer/kv_connector_metadata.h"
#include "kv_transfer/kv_transfer_config.h"
#include "sample/sampler.h"
#include "scheduler/scheduler_output.h"
#include "speculative/speculative_config.h"
#include "tensor/kv_cache_dtype.h"

namespace pagoda {

// What rank 0 tells every worker once, before the first step (vLLM's initialize_from_config): the
// KV cache to allocate, and how to draft tokens for speculative decoding.
struct WorkerInit {
  int64_t num_blocks = 0;              // of the model's KV cache; the draft model's has 9 per 8 of them
  int64_t block_size = 16;
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kF32;
  SpeculativeConfig speculative;       // validated (EngineConfig::validate)
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 0;
  bool enable_prefix_caching = true;
  KvConnectorWorkerConfig kv_connector;  // the worker side of --kv-transfer-config (none by default)

  bool operator==(const WorkerInit&) const = default;
};

// A request the workers have not seen: everything about it that does not change.
struct NewRequestData {
  RequestId request_id = 0;
  std::vector<TokenId> prompt_tokens;
  SamplingParams params;
  uint64_t seed = 0;                           // its generator's seed
  std::vector<TokenId> min_tokens_suppressed;  // masked while fewer than params.min_tokens are out
  std::string cache_salt;                      // the draft model's prefix-cache isolation
  int64_t skip_draws = 0;                      // generator draws made elsewhere (a prefill instance's first token)

  bool operator==(const NewRequestData&) const = default;
};

// One scheduled request of the step, as a delta on what the workers already hold.
struct ScheduledRequestData {
  RequestId request_id = 0;
  std::vector<TokenId> new_output_tokens;  // output tokens appended since the workers last saw it
  bool reset_blocks = false;               // new_block_ids replace the table (first step, or resumed
                                           // after a preemption) instead of extending it
  std::vector<BlockId> new_block_ids;
  int64_t num_computed_tokens = 0;  // tokens with KV before this step: the position of the first
  int64_t num_scheduled_tokens = 0;  // tokens [num_computed, num_computed + this) are computed
  std::vector<TokenId> draft_tokens;  // speculative drafts verified after them
  bool sample = false;               // the step reaches the request's last token
  std::vector<uint64_t> allowed_tokens;  // ScheduledSeq::allowed_tokens

  bool operator==(const ScheduledRequestData&) const = default;
};

struct StepMessage {
  uint64_t step = 0;  // 1, 2, 3, ...: a worker checks it gets every step once, in order
  std::vector<NewRequestData> new_requests;       // first scheduled this step (before `scheduled`)
  std::vector<ScheduledRequestData> scheduled;    // the batch, in the scheduler's order
  std::vector<RequestId> preempted;  // their KV is gone; a later step resets their block table
  std::vector<RequestId> finished;   // ended since the last step: the workers forget them
  KvConnectorMetadata kv_connector;  // SchedulerOutput::kv_connector

  bool operator==(const StepMessage&) const = default;
};

std::vector<uint8_t> serialize_step(const StepMessage& message);
// data_loss naming the problem when `bytes` is not one whole message.
Result<StepMessage> deserialize_step(std::span<const uint8_t> bytes);

std::vector<uint8_t> serialize_output(const ModelRunnerOutput& output);
Result<ModelRunnerOutput> deserialize_output(std::span<const uint8_t> bytes);

std::vector<uint8_t> serialize_init(const WorkerInit& init);
Result<WorkerInit> deserialize_init(std::span<const uint8_t> bytes);

// Rank 0's side: turns each SchedulerOutput (views into the scheduler's requests) into the
// StepMessage that brings the workers up to date, remembering what they have been sent.
class StepEncoder {
 public:
  // A request's fixed data, sent with its first scheduled step; its prompt_tokens are taken from
  // that step's SchedulerOutput. Ids are not reused.
  void add_request(NewRequestData request);
  // The request ended: forgotten here, and named in the next message's `finished` when the
  // workers had seen it.
  void remove_request(RequestId id);

  // The message for this step. Every scheduled request must have been added and not removed.
  StepMessage encode(const SchedulerOutput& scheduled);
  // Requests preempted by a step that scheduled nothing (so has no message of its own): the
  // next message names them.
  void preempt(std::span<const RequestId> ids);

  // Whether ended or preempted requests wait to be named in a message (an idle engine sends
  // one with nothing scheduled, so that the workers let go of them).
  bool has_notices() const { return !finished_.empty() || !preempted_.empty(); }

  // Requests added and not yet removed (for tests).
  size_t num_requests() const { return requests_.size(); }

 private:
  struct Known {
    std::optional<NewRequestData> unsent;  // set until the request's first scheduled step sends it
    size_t num_output_tokens = 0;          // output tokens the workers hold
    size_t num_blocks = 0;                 // block ids the workers hold
    bool blocks_valid = false;             // false until first sent and after a preemption: the
                                           // next step sends the whole table
  };
  uint64_t step_ = 0;
  std::unordered_map<RequestId, Known> requests_;  // added and not yet removed
  std::vector<RequestId> finished_;  // for the next message
  std::vector<RequestId> preempted_; // for the next message
};

}  // namespace pagoda
