#include "engine/output_processor.h"

#include <algorithm>

#include "base/check.h"

namespace pagoda {
namespace {

uint64_t mix_seed(uint64_t a, uint64_t b) {  // splitmix64 of a combined value
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

SequenceOutput::SequenceOutput(const Tokenizer& tokenizer, std::vector<std::string> stop_strings,
                               bool include_stop_str, bool skip_special, bool after_text)
    : detok_(tokenizer, skip_special), stops_(std::move(stop_strings)), include_stop_(include_stop_str) {
  for (const auto& s : stops_) max_stop_len_ = std::max(max_stop_len_, s.size());
  if (after_text) detok_.continue_text();
}

bool SequenceOutput::push(TokenId id) {
  if (finished_) return false;
  const size_t old_len = text_.size();
  text_ += detok_.push(id);
  if (stops_.empty() || text_.size() == old_len) return false;
  // A match must end inside the new text, so it starts at most max_stop_len - 1 bytes earlier.
  const size_t from = old_len >= max_stop_len_ - 1 ? old_len - (max_stop_len_ - 1) : 0;
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& s : stops_) {
    size_t at = text_.find(s, from);
    if (at != std::string::npos && at < best) {
      best = at;
      best_stop = &s;
    }
  }
  if (!best_stop) return false;
  matched_stop_ = *best_stop;
  text_.resize(best + (include_stop_ ? best_stop->size() : 0));
  emitted_ = std::min(emitted_, text_.size());
  finished_ = true;
  return true;
}

void SequenceOutput::finish() {
  if (!finished_) text_ += detok_.flush();
  finished_ = true;
}

std::string SequenceOutput::take_ready_text() {
  size_t ready = text_.size();
  if (!finished_ && max_stop_len_ > 1) {
    // Hold back what could be the start of a stop string, on a UTF-8 character boundary.
    ready = text_.size() > max_stop_len_ - 1 ? text_.size() - (max_stop_len_ - 1) : 0;
    while (ready > 0 && (static_cast<unsigned char>(text_[ready]) & 0xC0) == 0x80) --ready;
  }
  if (ready <= emitted_) return {};
  std::string out = text_.substr(emitted_, ready - emitted_);
  emitted_ = ready;
  return out;
}

OutputProcessor::OutputProcessor(std::shared_ptr<const Tokenizer> tokenizer, const EngineConfig& config)
    : tokenizer_(std::move(tokenizer)), max_model_len_(config.scheduler.max_model_len), seed_(config.seed) {}

Result<std::vector<CoreRequest>> OutputProcessor::add_request(RequestId id, const GenerateRequest& r) {
  if (children_.count(id)) return invalid_argument("duplicate request id " + std::to_string(id));
  std::vector<TokenId> stop_ids = r.params.stop_token_ids;
  if (!r.params.ignore_eos) {
    for (TokenId t : tokenizer_->stop_ids()) stop_ids.push_back(t);
  }
  const auto now = std::chrono::steady_clock::now();
  // Whether the output continues visible prompt text (anything but special tokens such as BOS).
  const bool after_text = std::any_of(r.prompt_token_ids.begin(), r.prompt_token_ids.end(), [&](TokenId t) {
    return !tokenizer_->is_special(t) && !tokenizer_->token_bytes(t).empty();
  });
  std::vector<CoreRequest> out;
  std::vector<RequestId>& children = children_[id];
  for (int64_t i = 0; i < r.params.n; ++i) {
    const RequestId seq_id = next_seq_id_++;
    CoreRequest c;
    c.id = seq_id;
    c.prompt_token_ids = r.prompt_token_ids;
    c.params = r.params;
    c.seed = r.params.seed ? *r.params.seed + static_cast<uint64_t>(i) : mix_seed(seed_, seq_id);
    c.min_tokens_suppressed = stop_ids;
    c.constraint = r.constraint;
    c.starts_text = !after_text;
    c.priority = r.priority;
    c.cache_salt = r.cache_salt;
    c.use_prefix_cache = !r.params.prompt_logprobs.has_value();
    // One prefill instance's first token belongs to one sequence: with n > 1 each computes its own.
    if (r.params.n == 1) c.kv_transfer = r.kv_transfer;
    out.push_back(std::move(c));
    Sequence s;
    s.parent = id;
    s.index = i;
    s.prompt_tokens = static_cast<int64_t>(r.prompt_token_ids.size());
    s.output = std::make_unique<SequenceOutput>(*tokenizer_, r.params.stop, r.params.include_stop_str_in_output,
                                                r.params.skip_special_tokens, after_text);
    s.stop_token_ids = stop_ids;
    s.min_tokens = r.params.min_tokens;
    s.max_tokens = r.params.max_tokens;
    s.want_logprobs = r.params.logprobs.has_value();
    s.want_prompt_logprobs = r.params.prompt_logprobs.has_value();
    s.arrival = now;
    seqs_.emplace(seq_id, std::move(s));
    children.push_back(seq_id);
  }
  return out;
}

void OutputProcessor::remove_request(RequestId id) {
  auto it = children_.find(id);
  if (it == children_.end()) return;
  for (RequestId seq_id : it->second) seqs_.erase(seq_id);
  children_.erase(it);
}

double OutputProcessor::since(const Sequence& s) const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - s.arrival).count();
}

OutputChunk OutputProcessor::finish_chunk(Sequence& s, FinishReason reason, TokenId stop_token) {
  OutputChunk c;
  c.request_id = s.parent;
  c.index = s.index;
  s.output->finish();
  c.text = s.output->take_ready_text();
  c.finish_reason = reason;
  c.stop_string = s.output->stop_string();
  c.stop_token = stop_token;
  c.prompt_tokens = s.prompt_tokens;
  c.completion_tokens = s.num_output_tokens;
  c.cached_tokens = s.num_cached_tokens;
  c.timings.queued_s = std::max(0.0, s.queued_s);
  c.timings.first_token_s = std::max(0.0, s.first_token_s);
  c.timings.finished_s = since(s);
  if (metrics_) {
    metrics_->record_finished(finish_reason_name(c.finish_reason), c.prompt_tokens, c.completion_tokens,
                              c.timings.queued_s, c.timings.first_token_s, c.timings.finished_s, metrics_engine_);
  }
  return c;
}

void OutputProcessor::forget(RequestId seq_id, const Sequence& s) {
  auto it = children_.find(s.parent);
  if (it != children_.end()) {
    std::vector<RequestId>& siblings = it->second;
    siblings.erase(std::remove(siblings.begin(), siblings.end(), seq_id), siblings.end());
    if (siblings.empty()) children_.erase(it);
  }
  seqs_.erase(seq_id);
}

OutputProcessor::Processed OutputProcessor::process(CoreStepOutput out) {
  Processed result;
  for (RequestId id : out.scheduled) {
    auto s = seqs_.find(id);
    if (s != seqs_.end() && s->second.queued_s < 0) {
      s->second.queued_s = std::chrono::duration<double>(out.scheduled_at - s->second.arrival).count();
    }
  }
  for (PromptLogprobsOutput& p : out.prompt_logprobs) {
    auto s = seqs_.find(p.request_id);
    if (s == seqs_.end()) continue;  // aborted while its step was in flight
    // A request preempted during its prompt computes those rows again: each position once.
    Sequence& seq = s->second;
    for (size_t i = 0; i < p.entries.size(); ++i) {
      if (p.first_index + static_cast<int64_t>(i) != seq.next_prompt_logprob) continue;
      seq.pending_prompt_logprobs.push_back(std::move(p.entries[i]));
      ++seq.next_prompt_logprob;
    }
  }
  if (metrics_) {
    for (const SpecDecodeCounts& c : out.spec) metrics_->record_spec_decode(c.num_draft_tokens, c.num_accepted, metrics_engine_);
  }
  for (RequestUpdate& u : out.updates) {
    auto it = seqs_.find(u.request_id);
    PAGODA_CHECK(it != seqs_.end());
    const RequestId seq_id = it->first;
    Sequence& s = it->second;
    s.num_cached_tokens = u.num_cached_tokens;
    s.num_external_tokens = u.num_external_tokens;
    // The tokens one by one, up to the one that stops the sequence; those after it (accepted
    // drafts) are dropped.
    FinishReason reason = FinishReason::kNone;
    TokenId stop_token = -1;
    OutputChunk c;
    c.request_id = s.parent;
    c.index = s.index;
    for (size_t i = 0; i < u.new_tokens.size(); ++i) {
      const TokenId t = u.new_tokens[i];
      ++s.num_output_tokens;
      c.token_ids.push_back(t);
      if (s.want_logprobs) c.logprobs.push_back(std::move(u.samples[i]));
      const bool stop_id = std::find(s.stop_token_ids.begin(), s.stop_token_ids.end(), t) != s.stop_token_ids.end();
      if (stop_id && s.num_output_tokens > s.min_tokens) {  // a stop id ends it, showing no text
        reason = FinishReason::kStop;
        stop_token = t;
        break;
      }
      if (s.output->push(t)) {  // a stop string ends it here
        reason = FinishReason::kStop;
        break;
      }
      if (s.num_output_tokens >= s.max_tokens || s.prompt_tokens + s.num_output_tokens >= max_model_len_) {
        reason = FinishReason::kLength;
        break;
      }
    }
    const auto now = std::chrono::steady_clock::now();
    if (!c.token_ids.empty() && metrics_) {
      if (s.first_token_s < 0) {
        metrics_->record_tokens(s.prompt_tokens, 0, metrics_engine_);
        const int64_t cached = std::min(s.num_cached_tokens, s.prompt_tokens);
        const int64_t external = std::min(s.num_external_tokens, s.prompt_tokens - cached);
        metrics_->record_prompt_sources(s.prompt_tokens - cached - external, cached, external, metrics_engine_);
      } else {
        metrics_->record_inter_token(std::chrono::duration<double>(now - s.last_token).count(), metrics_engine_);
      }
      metrics_->record_tokens(0, static_cast<int64_t>(c.token_ids.size()), metrics_engine_);
    }
    if (!c.token_ids.empty()) s.last_token = now;
    if (s.first_token_s < 0) s.first_token_s = since(s);
    if (s.want_prompt_logprobs) c.prompt_logprobs = std::move(s.pending_prompt_logprobs);
    s.pending_prompt_logprobs.clear();
    if (reason != FinishReason::kNone) {
      OutputChunk last = finish_chunk(s, reason, stop_token);
      last.token_ids = std::move(c.token_ids);
      last.logprobs = std::move(c.logprobs);
      last.prompt_logprobs = std::move(c.prompt_logprobs);
      result.chunks.push_back(std::move(last));
      result.finished.push_back(seq_id);
      forget(seq_id, s);
    } else {
      c.text = s.output->take_ready_text();
      result.chunks.push_back(std::move(c));
    }
  }
  return result;
}

std::vector<OutputChunk> OutputProcessor::abort(RequestId id, FinishReason reason, std::vector<RequestId>* seq_ids) {
  std::vector<OutputChunk> out;
  auto it = children_.find(id);
  if (it == children_.end()) return out;
  const std::vector<RequestId> open = it->second;
  for (RequestId seq_id : open) {
    Sequence& s = seqs_.at(seq_id);
    out.push_back(finish_chunk(s, reason, -1));
    seq_ids->push_back(seq_id);
    forget(seq_id, s);
  }
  return out;
}

void OutputProcessor::record_step(const SchedulerStats& st, int64_t scheduled_tokens) {
  if (!metrics_) return;
  metrics_->record_step(st.num_running, st.num_waiting, st.kv_usage, static_cast<uint64_t>(st.prefix_cache.queries),
                        static_cast<uint64_t>(st.prefix_cache.hits), static_cast<uint64_t>(st.num_preemptions),
                        scheduled_tokens, metrics_engine_);
}

void OutputProcessor::record_kv_connector(const KvConnectorStats& st) {
  if (!metrics_) return;
  metrics::KvOffloadTotals t;
  t.queries = st.queries;
  t.hits = st.hits;
  t.disk_hits = st.disk_hits;
  t.failed_loads = st.failed_loads;
  const KvTransferCounters& m = st.moved;
  t.stored_blocks = m.stored_blocks;
  t.stored_bytes = m.stored_bytes;
  t.loaded_blocks = m.loaded_blocks;
  t.loaded_bytes = m.loaded_bytes;
  t.disk_loaded_blocks = m.disk_loaded_blocks;
  t.disk_loaded_bytes = m.disk_loaded_bytes;
  t.disk_written_blocks = m.disk_stored_blocks;
  t.disk_written_bytes = m.disk_stored_bytes;
  t.load_seconds = m.load_seconds;
  t.store_seconds = m.store_seconds;
  t.remote_queries = st.remote_queries;
  t.remote_hits = st.remote_hits;
  t.staged_blocks = m.staged_blocks;
  t.staged_bytes = m.staged_bytes;
  t.sent_blocks = m.sent_blocks;
  t.sent_bytes = m.sent_bytes;
  t.received_blocks = m.received_blocks;
  t.received_bytes = m.received_bytes;
  t.failed_transfers = m.failed_transfers;
  t.transfer_seconds = m.transfer_seconds;
  t.host_blocks = st.host_blocks;
  t.host_capacity = st.host_capacity;
  t.disk_blocks = st.disk_blocks;
  t.disk_capacity = st.disk_capacity;
  metrics_->record_kv_offload(t, metrics_engine_);
}

}  // namespace pagoda
