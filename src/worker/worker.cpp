#include "worker/worker.h"

#include <string>
#include <unordered_set>
#include <utility>

#include "base/check.h"

namespace pagoda {
namespace {

std::string id_text(RequestId id) { return "request " + std::to_string(id); }

// The first token of `tokens` outside [0, vocab), or -1.
int64_t bad_token(std::span<const TokenId> tokens, int64_t vocab) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= vocab) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

Worker::Worker(std::unique_ptr<ModelRunner> runner) : runner_(std::move(runner)) { PAGODA_CHECK(runner_ != nullptr); }

Status Worker::apply(const ScheduledRequestData& d, RequestState& r) const {
  const int64_t vocab = runner_->config().vocab_size;
  const int64_t num_blocks = runner_->kv_cache().num_blocks();
  const std::string who = id_text(d.request_id);
  if (int64_t i = bad_token(d.new_output_tokens, vocab); i >= 0) {
    return data_loss(who + ": output token " + std::to_string(d.new_output_tokens[static_cast<size_t>(i)]) +
                     " outside the vocabulary of " + std::to_string(vocab));
  }
  if (int64_t i = bad_token(d.draft_tokens, vocab); i >= 0) {
    return data_loss(who + ": draft token " + std::to_string(d.draft_tokens[static_cast<size_t>(i)]) +
                     " outside the vocabulary of " + std::to_string(vocab));
  }
  for (BlockId b : d.new_block_ids) {
    if (b < 0 || b >= num_blocks) {
      return data_loss(who + ": block " + std::to_string(b) + " outside the cache's " + std::to_string(num_blocks));
    }
  }
  r.all_tokens.insert(r.all_tokens.end(), d.new_output_tokens.begin(), d.new_output_tokens.end());
  if (d.reset_blocks) r.block_table.clear();
  r.block_table.insert(r.block_table.end(), d.new_block_ids.begin(), d.new_block_ids.end());

  const int64_t num_tokens = static_cast<int64_t>(r.all_tokens.size());
  const int64_t num_drafts = static_cast<int64_t>(d.draft_tokens.size());
  if (d.num_computed_tokens < 0 || d.num_scheduled_tokens < 0 || d.num_computed_tokens > num_tokens ||
      d.num_scheduled_tokens > num_tokens - d.num_computed_tokens) {
    return data_loss(who + ": tokens [" + std::to_string(d.num_computed_tokens) + ", +" +
                     std::to_string(d.num_scheduled_tokens) + ") scheduled, but it has " + std::to_string(num_tokens));
  }
  const bool reaches_end = d.num_computed_tokens + d.num_scheduled_tokens == num_tokens;
  if (d.sample != reaches_end || (num_drafts > 0 && !d.sample)) {
    return data_loss(who + ": sample is " + (d.sample ? "set" : "unset") + " for a step that " +
                     (reaches_end ? "reaches" : "stops before") + " its last token" +
                     (num_drafts > 0 ? " (with drafts)" : ""));
  }
  const int64_t bs = runner_->kv_cache().block_size();
  const int64_t last = d.num_computed_tokens + d.num_scheduled_tokens + num_drafts;  // positions [0, last)
  if (last > 0 && (last - 1) / bs >= static_cast<int64_t>(r.block_table.size())) {
    return data_loss(who + ": " + std::to_string(r.block_table.size()) + " blocks of " + std::to_string(bs) +
                     " tokens do not cover position " + std::to_string(last - 1));
  }
  return Status::ok_status();
}

Result<ModelRunnerOutput> Worker::execute(const StepMessage& m) {
  if (m.step != last_step_ + 1) {
    return data_loss("step message " + std::to_string(m.step) + " after step " + std::to_string(last_step_));
  }
  last_step_ = m.step;
  const int64_t vocab = runner_->config().vocab_size;
  for (RequestId id : m.finished) {
    if (!requests_.erase(id)) return data_loss("finished " + id_text(id) + " is unknown");
    runner_->remove_request(id);
  }
  for (RequestId id : m.preempted) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return data_loss("preempted " + id_text(id) + " is unknown");
    it->second.block_table.clear();
  }
  for (const NewRequestData& n : m.new_requests) {
    const std::string who = id_text(n.request_id);
    if (requests_.count(n.request_id)) return data_loss("new " + who + " is already known");
    if (n.prompt_tokens.empty()) return data_loss(who + ": empty prompt");
    if (int64_t i = bad_token(n.prompt_tokens, vocab); i >= 0) {
      return data_loss(who + ": prompt token " + std::to_string(n.prompt_tokens[static_cast<size_t>(i)]) +
                       " outside the vocabulary of " + std::to_string(vocab));
    }
    if (bad_token(n.min_tokens_suppressed, vocab) >= 0) return data_loss(who + ": a suppressed token outside the vocabulary");
    if (std::optional<InvalidParam> bad = n.params.check(vocab, vocab)) return data_loss(who + ": " + bad->message);
    RequestState r;
    r.all_tokens = n.prompt_tokens;
    r.num_prompt_tokens = n.prompt_tokens.size();
    requests_.emplace(n.request_id, std::move(r));
    runner_->add_request(n.request_id, n.params, n.seed, n.min_tokens_suppressed);
  }

  SchedulerOutput scheduled;
  scheduled.preempted = m.preempted;
  scheduled.seqs.reserve(m.scheduled.size());
  std::unordered_set<RequestId> seen;
  for (const ScheduledRequestData& d : m.scheduled) {
    auto it = requests_.find(d.request_id);
    if (it == requests_.end()) return data_loss("scheduled " + id_text(d.request_id) + " is unknown");
    if (!seen.insert(d.request_id).second) return data_loss(id_text(d.request_id) + " is scheduled twice");
    RequestState& r = it->second;
    PAGODA_RETURN_IF_ERROR(apply(d, r));
  }
  // Views are taken after every delta is applied (no vector grows after this).
  for (const ScheduledRequestData& d : m.scheduled) {
    const RequestState& r = requests_.at(d.request_id);
    const std::span<const TokenId> all(r.all_tokens);
    ScheduledSeq seq;
    seq.request_id = d.request_id;
    seq.tokens = all.subspan(static_cast<size_t>(d.num_computed_tokens), static_cast<size_t>(d.num_scheduled_tokens));
    seq.draft_tokens = d.draft_tokens;
    seq.num_computed_tokens = d.num_computed_tokens;
    seq.block_table = r.block_table;
    seq.sample = d.sample;
    seq.prompt_tokens = all.first(r.num_prompt_tokens);
    seq.output_tokens = all.subspan(r.num_prompt_tokens);
    scheduled.num_scheduled_tokens += d.num_scheduled_tokens;
    scheduled.seqs.push_back(seq);
  }
  return runner_->execute(scheduled);
}

}  // namespace pagoda
