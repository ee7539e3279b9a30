// Scheduler: vLLM v1's continuous batching. Each step hands out one token budget: running
// requests first (a decode takes one token, a partly computed prompt takes its next chunk), then
// waiting requests are admitted while budget, sequence slots and KV blocks allow. There is no
// prefill or decode phase; chunked prefill, prefix-cache hits and resumed preemptions all fall
// out of "num_computed_tokens catches up with num_tokens".
//
// When blocks run out for a running request, the most recently admitted running request (or
// the least important one under the priority policy) is preempted by recompute: its blocks are
// freed (they stay in the prefix cache) and it goes back to the front of the waiting queue. A
// step that preempted admits no new work.
//
// With a KV connector (kv_transfer/kv_connector.h), admission also asks it for the tokens after
// the prefix-cache hit that it can load: a request with some gets its blocks and waits (status
// kWaitingForKv, outside running_ and waiting_, taking no step budget) until the workers report
// the load; then it runs from there, or, if the load failed, computes those tokens itself.
// Engine thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/kv_cache_manager.h"
#include "kv_transfer/kv_connector.h"
#include "scheduler/request.h"
#include "scheduler/scheduler_output.h"

namespace pagoda {

enum class SchedulingPolicy { kFcfs, kPriority };

struct SchedulerConfig {
  int64_t max_num_batched_tokens = 2048;
  int64_t max_num_seqs = 256;
  int64_t max_model_len = 2048;
  int64_t long_prefill_token_threshold = 0;  // 0 = no cap on one request's share of a step
  SchedulingPolicy policy = SchedulingPolicy::kFcfs;
  // false (vLLM's --no-enable-chunked-prefill): a waiting request is admitted only when all its
  // uncomputed tokens fit in the step's remaining budget, so a prompt is never split across
  // steps; long_prefill_token_threshold does not apply. Needs max_num_batched_tokens >=
  // max_model_len (the engine checks), or a long prompt could never be admitted.
  bool enable_chunked_prefill = true;
};

// What one step did to one request.
struct RequestUpdate {
  RequestId request_id = 0;
  std::vector<TokenId> new_tokens;
  std::vector<SampledOutput> samples;  // with logprobs, parallel to new_tokens
  int64_t num_cached_tokens = 0;
  int64_t num_external_tokens = 0;     // prompt tokens a KV connector loaded instead
};

struct SchedulerStats {
  int64_t num_running = 0;
  int64_t num_waiting = 0;             // waiting_ and those waiting for a KV connector's load
  double kv_usage = 0;
  int64_t num_preemptions = 0;         // total so far
  PrefixCacheStats prefix_cache;       // totals so far
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config,
            std::unique_ptr<KvConnectorScheduler> connector = nullptr);

  // Adds a request to the waiting queue. Fails (and keeps nothing) when it can never run:
  // prompt + max_tokens beyond max_model_len, more blocks than the whole cache, or an empty prompt.
  Status add_request(std::unique_ptr<Request> request);

  // Picks this step's work. A decoding request with drafts (set_draft_tokens) is scheduled with
  // its last token and as many drafts as the budget and max_model_len allow; its blocks are
  // allocated for all of them (preempting as for any other request when they run out).
  // `max_seqs` > 0 caps this step's sequences (a pipeline splits its requests over the steps in
  // flight; the rest wait for the next step, in the same order).
  SchedulerOutput schedule(int64_t max_seqs = 0);

  // Drafts (speculative decoding) for request `id`'s next step, replacing any it had; kept only
  // while it is running and decoding (every token but the last computed), else dropped.
  void set_draft_tokens(RequestId id, std::vector<TokenId> drafts);

  // Applies the runner's sampled tokens: gives back the KV positions of rejected drafts, appends
  // each request's tokens and takes the next step's drafts (set_draft_tokens). Returns one update
  // per request that got tokens. Nothing finishes here: the engine's output processor decides
  // which requests stopped (stop ids, max_tokens, max_model_len, stop strings) and finishes them
  // (finish_request) before the next step.
  std::vector<RequestUpdate> update_from_output(const SchedulerOutput& scheduled,
                                                const ModelRunnerOutput& produced);

  // Ends a request wherever it is (waiting or running), freeing its blocks now. Returns false if
  // the id is unknown or already finished.
  bool finish_request(RequestId id);

  bool has_unfinished() const { return !waiting_.empty() || !running_.empty() || !loading_.empty(); }
  int64_t num_unfinished() const {
    return static_cast<int64_t>(waiting_.size() + running_.size() + loading_.size());
  }
  SchedulerStats stats() const;
  const KvCacheManager& kv() const { return kv_; }
  // The KV connector (null without one).
  const KvConnectorScheduler* connector() const { return connector_.get(); }
  const Request* find(RequestId id) const;

 private:
  Request* preempt_one(std::vector<Request*>& scheduled);
  void finish(Request* r);
  void enqueue_waiting(Request* r, bool front);
  Request* pop_waiting_head();
  Request* peek_waiting_head();

  SchedulerConfig config_;
  KvCacheManager kv_;
  std::unordered_map<RequestId, std::unique_ptr<Request>> requests_;  // unfinished only
  std::deque<Request*> waiting_;   // FCFS order (priority policy: kept sorted)
  std::vector<Request*> running_;  // admission order
  std::vector<Request*> loading_;  // kWaitingForKv, admission order
  std::unique_ptr<KvConnectorScheduler> connector_;
  int64_t total_preemptions_ = 0;
};

}  // namespace pagoda
