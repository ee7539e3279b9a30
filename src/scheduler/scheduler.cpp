#include "scheduler/scheduler.h"

#include <algorithm>

#include "base/check.h"

namespace pagoda {
namespace {

KvRequest kv_view(const Request& r) {
  return KvRequest{r.id, r.all_tokens, r.cache_salt, r.use_prefix_cache, r.kv_transfer ? &*r.kv_transfer : nullptr};
}

}  // namespace

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

Scheduler::Scheduler(const SchedulerConfig& config, const KvCacheConfig& kv_config,
                     std::unique_ptr<KvConnectorScheduler> connector)
    : config_(config), kv_(kv_config), connector_(std::move(connector)) {}

Status Scheduler::add_request(std::unique_ptr<Request> r) {
  if (r->prompt_tokens.empty()) return invalid_argument("the prompt is empty");
  if (r->max_tokens < 1) return invalid_argument("max_tokens must be at least 1");
  const int64_t prompt_len = static_cast<int64_t>(r->prompt_tokens.size());
  if (prompt_len + r->max_tokens > config_.max_model_len) {
    return invalid_argument("this model's maximum context length is " +
                            std::to_string(config_.max_model_len) + " tokens; the prompt has " +
                            std::to_string(prompt_len) + " and max_tokens asks for " +
                            std::to_string(r->max_tokens) + " more");
  }
  const int64_t blocks = kv_.blocks_for(prompt_len + r->max_tokens);
  if (blocks > kv_.pool().num_blocks()) {
    return invalid_argument("the request needs " + std::to_string(blocks) +
                            " KV cache blocks but the whole cache has " +
                            std::to_string(kv_.pool().num_blocks()));
  }
  if (requests_.count(r->id)) return invalid_argument("duplicate request id " + std::to_string(r->id));
  r->all_tokens = r->prompt_tokens;
  r->all_tokens.insert(r->all_tokens.end(), r->output_tokens.begin(), r->output_tokens.end());
  r->status = RequestStatus::kWaiting;
  Request* raw = r.get();
  requests_.emplace(r->id, std::move(r));
  enqueue_waiting(raw, /*front=*/false);
  return Status::ok_status();
}

void Scheduler::enqueue_waiting(Request* r, bool front) {
  if (config_.policy == SchedulingPolicy::kPriority) {
    auto before = [](const Request* a, const Request* b) {
      return a->priority != b->priority ? a->priority < b->priority : a->arrival_seq < b->arrival_seq;
    };
    waiting_.insert(std::upper_bound(waiting_.begin(), waiting_.end(), r, before), r);
  } else if (front) {
    waiting_.push_front(r);
  } else {
    waiting_.push_back(r);
  }
}

Request* Scheduler::peek_waiting_head() { return waiting_.empty() ? nullptr : waiting_.front(); }

Request* Scheduler::pop_waiting_head() {
  Request* r = waiting_.front();
  waiting_.pop_front();
  return r;
}

// Frees the victim's blocks, puts it back at the front of the waiting queue and drops it from
// this step's batch. Returns the victim, or null when every running request is in a step in
// flight (pipeline parallelism): those keep their blocks, which the step is still writing, and
// their sampled tokens, which a preemption would drop after the sampler drew them.
Request* Scheduler::preempt_one(std::vector<Request*>& scheduled) {
  auto victim_it = running_.end();
  for (auto it = running_.begin(); it != running_.end(); ++it) {
    if ((*it)->steps_in_flight > 0) continue;
    if (victim_it == running_.end()) {
      victim_it = it;
    } else if (config_.policy == SchedulingPolicy::kPriority) {
      // The least important: the highest priority value, the latest arrival among equals.
      const Request* a = *victim_it;
      const Request* b = *it;
      if (a->priority != b->priority ? a->priority < b->priority : a->arrival_seq < b->arrival_seq) victim_it = it;
    } else {
      victim_it = it;  // FCFS: the most recently admitted
    }
  }
  if (victim_it == running_.end()) return nullptr;
  Request* victim = *victim_it;
  running_.erase(victim_it);
  kv_.free(victim->id);
  victim->status = RequestStatus::kPreempted;
  victim->num_computed_tokens = 0;
  victim->spec_tokens.clear();
  victim->scheduled_spec_tokens.clear();
  ++victim->num_preemptions;
  ++total_preemptions_;
  enqueue_waiting(victim, /*front=*/true);
  scheduled.erase(std::remove(scheduled.begin(), scheduled.end(), victim), scheduled.end());
  return victim;
}

SchedulerOutput Scheduler::schedule(int64_t max_seqs) {
  SchedulerOutput out;
  int64_t budget = config_.max_num_batched_tokens;
  const size_t seq_cap = max_seqs > 0 ? static_cast<size_t>(max_seqs) : SIZE_MAX;
  std::vector<Request*> scheduled;                  // in batch order
  std::unordered_map<Request*, int64_t> num_new;    // tokens per scheduled request
  auto cap = [&](const Request* r, int64_t n) {
    if (config_.long_prefill_token_threshold > 0) n = std::min(n, config_.long_prefill_token_threshold);
    n = std::min(n, budget);
    return std::min(n, config_.max_model_len - r->num_computed_tokens);
  };

  // 1. Running requests, oldest admitted first.
  bool preempted = false;
  bool blocked = false;  // a running request found no blocks and nothing to preempt
  for (size_t i = 0; i < running_.size() && budget > 0 && scheduled.size() < seq_cap;) {
    Request* r = running_[i];
    const int64_t uncomputed = r->num_tokens() - r->num_computed_tokens;
    const int64_t drafts = uncomputed == 1 ? static_cast<int64_t>(r->spec_tokens.size()) : 0;
    const int64_t n = cap(r, uncomputed + drafts);
    if (n <= 0) {
      ++i;
      continue;
    }
    bool placed = true;
    while (!kv_.allocate_slots(r->id, r->all_tokens, r->num_computed_tokens, n, {}, r->cache_salt)) {
      Request* victim = preempt_one(scheduled);
      if (victim == nullptr) {  // the others are in flight: r waits for their blocks
        placed = false;
        blocked = true;
        break;
      }
      preempted = true;
      out.preempted.push_back(victim->id);
      placed = victim != r;
      // A request preempted after being scheduled this step gives its tokens back.
      for (auto it = num_new.begin(); it != num_new.end();) {
        if (std::find(scheduled.begin(), scheduled.end(), it->first) == scheduled.end()) {
          budget += it->second;
          it = num_new.erase(it);
        } else {
          ++it;
        }
      }
      if (!placed) break;
    }
    if (!placed) break;  // r itself was the victim: nothing more fits this step
    // The drafts that fit (the caps may have cut some), held until this step's update.
    r->scheduled_spec_tokens.assign(r->spec_tokens.begin(),
                                    r->spec_tokens.begin() + std::max<int64_t>(0, n - uncomputed));
    r->spec_tokens.clear();
    scheduled.push_back(r);
    num_new[r] = n;
    budget -= n;
    i = static_cast<size_t>(std::find(running_.begin(), running_.end(), r) - running_.begin()) + 1;
  }

  // 2. Waiting requests, unless this step had to preempt (never preempt to admit new work).
  // Requests waiting for a connector's load hold sequence slots too: they join running_ next.
  while (!preempted && !blocked && budget > 0 && scheduled.size() < seq_cap &&
         static_cast<int64_t>(running_.size() + loading_.size()) < config_.max_num_seqs) {
    Request* r = peek_waiting_head();
    if (!r) break;
    ComputedBlocks hit;
    if (r->use_prefix_cache) hit = kv_.get_computed_blocks(r->id, r->all_tokens, r->cache_salt);
    const int64_t computed = hit.num_tokens;
    const int64_t saved = r->num_computed_tokens;
    r->num_computed_tokens = computed;
    const int64_t external = connector_ ? connector_->get_num_new_matched_tokens(kv_view(*r), computed) : 0;
    if (external > 0) {
      // Blocks for the loaded tokens too, published to the prefix cache only once they are there.
      if (!kv_.allocate_slots(r->id, r->all_tokens, computed, external, hit, r->cache_salt, computed)) {
        r->num_computed_tokens = saved;
        break;
      }
      pop_waiting_head();
      r->status = RequestStatus::kWaitingForKv;
      if (r->num_cached_tokens < 0) r->num_cached_tokens = computed;
      r->num_external_tokens = external;
      loading_.push_back(r);
      connector_->update_state_after_alloc(kv_view(*r), kv_.block_table(r->id), computed, external);
      continue;
    }
    const int64_t n = config_.enable_chunked_prefill ? cap(r, r->num_tokens() - computed) : r->num_tokens() - computed;
    if (n <= 0 || n > budget || !kv_.allocate_slots(r->id, r->all_tokens, computed, n, hit, r->cache_salt)) {
      r->num_computed_tokens = saved;
      break;  // head-of-line: admission waits for room, in order
    }
    pop_waiting_head();
    r->status = RequestStatus::kRunning;
    if (r->num_cached_tokens < 0) r->num_cached_tokens = computed;
    if (connector_) connector_->update_state_after_alloc(kv_view(*r), kv_.block_table(r->id), computed, 0);
    running_.push_back(r);
    scheduled.push_back(r);
    num_new[r] = n;
    budget -= n;
  }

  // 3. The batch, with block tables read after every allocation of the step.
  for (Request* r : scheduled) {
    const int64_t n = num_new[r];
    const int64_t drafts = static_cast<int64_t>(r->scheduled_spec_tokens.size());
    ScheduledSeq seq;
    seq.request_id = r->id;
    seq.tokens = std::span<const TokenId>(r->all_tokens).subspan(static_cast<size_t>(r->num_computed_tokens),
                                                                 static_cast<size_t>(n - drafts));
    seq.draft_tokens = r->scheduled_spec_tokens;
    seq.num_computed_tokens = r->num_computed_tokens;
    seq.block_table = kv_.block_table(r->id);
    seq.sample = r->num_computed_tokens + n - drafts == r->num_tokens();
    seq.prompt_tokens = r->prompt_tokens;
    seq.output_tokens = r->output_tokens;
    out.seqs.push_back(seq);
    out.num_scheduled_tokens += n;
    if (connector_) connector_->on_scheduled(kv_view(*r), r->num_computed_tokens + n - drafts, seq.block_table);
    // 4. Optimistic advance: the next step may schedule the next chunk right away.
    r->num_computed_tokens += n;
    ++r->steps_in_flight;
  }
  if (connector_) out.kv_connector = connector_->build_meta();
  PAGODA_CHECK(out.num_scheduled_tokens <= config_.max_num_batched_tokens);
  PAGODA_CHECK(static_cast<int64_t>(running_.size()) <= config_.max_num_seqs);
  return out;
}

std::vector<RequestUpdate> Scheduler::update_from_output(const SchedulerOutput& scheduled,
                                                         const ModelRunnerOutput& produced) {
  // A decode instance's first token, sampled by the prefill instance (kv_transfer_params).
  std::vector<SampledOutput> given;
  if (connector_) {
    // Loads that ended: the request runs from after its loaded tokens, or, when the load failed,
    // computes them (its blocks are its own either way).
    std::vector<RequestId> done, failed;
    connector_->update_connector_output(scheduled.kv_connector, produced.kv_connector, done, failed);
    for (const auto* list : {&done, &failed}) {
      for (RequestId id : *list) {
        auto it = requests_.find(id);
        if (it == requests_.end() || it->second->status != RequestStatus::kWaitingForKv) continue;
        Request* r = it->second.get();
        loading_.erase(std::remove(loading_.begin(), loading_.end(), r), loading_.end());
        if (list == &done) {
          r->num_computed_tokens += r->num_external_tokens;
        } else {
          r->num_external_tokens = 0;
        }
        r->status = RequestStatus::kRunning;
        running_.push_back(r);
        // Not loaded again after a preemption: the prefill instance let go of it.
        if (r->kv_transfer) r->kv_transfer->do_remote_prefill = false;
        // A whole prompt received: it goes on from the prefill instance's first token, or (without
        // one) computes its last token again for the logits. After a failed load the first token
        // still stands (the prompt is computed, its last logits unused), so the request gives
        // the same tokens either way.
        const KvFirstToken* first =
            r->kv_transfer && r->kv_transfer->first_token ? &*r->kv_transfer->first_token : nullptr;
        if (first != nullptr && r->output_tokens.empty()) {
          SampledOutput s{r->id, first->token, first->logprob, {}};
          for (const auto& [token, logprob] : first->top_logprobs) s.top_logprobs.push_back({token, logprob});
          given.push_back(std::move(s));
        } else if (r->num_computed_tokens == r->num_tokens()) {
          --r->num_computed_tokens;  // computed here after all
          --r->num_external_tokens;
        }
      }
    }
  }
  // Rejected drafts: their positions are computed no longer (their KV is overwritten later).
  for (const SpecDecodeCounts& c : produced.spec) {
    auto it = requests_.find(c.request_id);
    if (it == requests_.end() || it->second->status != RequestStatus::kRunning) continue;
    PAGODA_CHECK(c.num_accepted >= 0 && c.num_accepted <= c.num_draft_tokens);
    it->second->num_computed_tokens -= c.num_draft_tokens - c.num_accepted;
  }
  for (const ScheduledSeq& seq : scheduled.seqs) {
    auto it = requests_.find(seq.request_id);
    if (it == requests_.end()) continue;
    it->second->scheduled_spec_tokens.clear();
    --it->second->steps_in_flight;
  }
  std::vector<RequestUpdate> updates;
  std::vector<const SampledOutput*> samples;
  for (const SampledOutput& s : produced.sampled) samples.push_back(&s);
  for (const SampledOutput& s : given) samples.push_back(&s);
  for (const SampledOutput* sampled : samples) {
    const SampledOutput& s = *sampled;
    auto it = requests_.find(s.request_id);
    if (it == requests_.end()) continue;  // aborted while its step was in flight
    Request* r = it->second.get();
    if (r->status != RequestStatus::kRunning) continue;
    r->output_tokens.push_back(s.token);
    r->all_tokens.push_back(s.token);
    if (updates.empty() || updates.back().request_id != r->id) {
      updates.emplace_back();
      updates.back().request_id = r->id;
    }
    RequestUpdate& u = updates.back();
    u.new_tokens.push_back(s.token);
    u.samples.push_back(s);
    u.num_cached_tokens = std::max<int64_t>(0, r->num_cached_tokens);
    u.num_external_tokens = r->num_external_tokens;
  }
  // The next step's drafts, for the decoding requests still running.
  for (const DraftTokens& d : produced.drafts) set_draft_tokens(d.request_id, d.tokens);
  // A request with more positions computed than tokens would never be scheduled again.
  for (const ScheduledSeq& seq : scheduled.seqs) {
    const Request* r = find(seq.request_id);
    if (r != nullptr && r->status == RequestStatus::kRunning) PAGODA_CHECK(r->num_computed_tokens <= r->num_tokens());
  }
  return updates;
}

void Scheduler::set_draft_tokens(RequestId id, std::vector<TokenId> drafts) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  Request* r = it->second.get();
  const bool decoding = r->status == RequestStatus::kRunning && r->num_computed_tokens == r->num_tokens() - 1;
  r->spec_tokens = decoding ? std::move(drafts) : std::vector<TokenId>();
}

void Scheduler::finish(Request* r) {
  if (connector_) connector_->request_finished(kv_view(*r));
  kv_.free(r->id);
  loading_.erase(std::remove(loading_.begin(), loading_.end(), r), loading_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), r), running_.end());
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), r), waiting_.end());
  r->status = RequestStatus::kFinished;
  requests_.erase(r->id);  // destroys r
}

bool Scheduler::finish_request(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  finish(it->second.get());
  return true;
}

const Request* Scheduler::find(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? nullptr : it->second.get();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.num_running = static_cast<int64_t>(running_.size());
  s.num_waiting = static_cast<int64_t>(waiting_.size() + loading_.size());
  s.kv_usage = kv_.usage();
  s.num_preemptions = total_preemptions_;
  s.prefix_cache = kv_.stats();
  return s;
}

}  // namespace pagoda
