#include "engine/engine_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "base/check.h"
#include "base/memory_info.h"
#include "engine/request_validation.h"
#include "engine/kv_cache_sizing.h"
#include "kv/kv_cache_manager.h"

namespace pagoda {

namespace {

uint64_t mix_seed(uint64_t a, uint64_t b) {  // splitmix64 of a combined value
  uint64_t z = a * 0x9E3779B97F4A7C15ull + b + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

Result<int64_t> parse_byte_size(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (...) {
    return invalid_argument("not a byte size: '" + text + "' (e.g. 4GiB, 512MiB, 1000000)");
  }
  std::string unit = text.substr(used);
  double mult = 1;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "TiB" || unit == "T") mult = 1024.0 * 1024 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  else if (unit == "TB") mult = 1e12;
  else return invalid_argument("unknown unit in byte size '" + text + "' (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)");
  double bytes = value * mult;
  if (!(bytes > 0) || bytes > 9.0e18) return invalid_argument("byte size out of range: '" + text + "'");
  return static_cast<int64_t>(bytes);
}

Result<std::unique_ptr<EngineCore>> EngineCore::create(std::unique_ptr<Executor> executor,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineConfig& config) {
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->config_ = config;
  core->tokenizer_ = std::move(tokenizer);
  EngineConfig& c = core->config_;
  PAGODA_RETURN_IF_ERROR(c.validate(&executor->config(), executor->draft_config()));
  if (c.speculative.enabled() && executor->max_in_flight() > 1) {
    return invalid_argument("speculative decoding with pipeline parallelism: the drafts of a request need its "
                            "last token, which is still in the pipeline; use one or the other");
  }
  // The executor's workers say what they hold and need; the KV cache gets what the memory rule
  // leaves (kv_cache_sizing.h), and every worker allocates it.
  PAGODA_ASSIGN_OR_RETURN(const WorkerMemory memory,
                          executor->memory(c.block_size, c.kv_cache_dtype, c.scheduler.max_num_batched_tokens,
                                           c.scheduler.max_num_seqs));
  PAGODA_ASSIGN_OR_RETURN(const KvCachePlan plan, plan_kv_cache(memory, c));
  core->memory_ = memory;
  if (c.kv_cache_dtype != KvCacheDtype::kF32) {  // for the summary: what a float32 block would take
    PAGODA_ASSIGN_OR_RETURN(const WorkerMemory f32, executor->memory(c.block_size, KvCacheDtype::kF32, 1, 1));
    core->f32_block_bytes_ = f32.block_bytes;
  }
  core->kv_sizing_ = plan.sizing;
  core->init_ = WorkerInit{plan.num_blocks, c.block_size, c.kv_cache_dtype, c.speculative, c.scheduler.max_model_len,
                           c.scheduler.max_num_batched_tokens, c.enable_prefix_caching};
  PAGODA_RETURN_IF_ERROR(executor->initialize(core->init_));
  core->speculation_ = executor->proposer_description();
  core->executor_ = std::move(executor);
  KvCacheConfig kvc{static_cast<int32_t>(plan.num_blocks), c.block_size, c.enable_prefix_caching};
  core->scheduler_ = std::make_unique<Scheduler>(c.scheduler, kvc);
  return core;
}

Result<std::unique_ptr<EngineCore>> EngineCore::create(std::unique_ptr<Model> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineConfig& config, std::unique_ptr<Model> draft_model) {
  auto worker = std::make_unique<Worker>(std::move(model), std::move(draft_model));
  return create(std::make_unique<LocalExecutor>(std::move(worker), config.serialize_steps, config.steps_in_flight),
                std::move(tokenizer), config);
}

Result<std::unique_ptr<EngineCore>> EngineCore::create_replica(const EngineCore& like,
                                                               std::unique_ptr<Executor> executor) {
  if (like.config_.speculative.enabled() && executor->max_in_flight() > 1) {
    return invalid_argument("speculative decoding with pipeline parallelism: the drafts of a request need its "
                            "last token, which is still in the pipeline; use one or the other");
  }
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->config_ = like.config_;
  core->tokenizer_ = like.tokenizer_;
  core->memory_ = like.memory_;
  core->f32_block_bytes_ = like.f32_block_bytes_;
  core->kv_sizing_ = like.kv_sizing_;
  core->init_ = like.init_;
  core->speculation_ = like.speculation_;
  // The same start as the replica it copies: its workers allocate as many blocks.
  PAGODA_RETURN_IF_ERROR(executor->initialize(core->init_));
  core->executor_ = std::move(executor);
  KvCacheConfig kvc{static_cast<int32_t>(core->init_.num_blocks), core->config_.block_size,
                    core->config_.enable_prefix_caching};
  core->scheduler_ = std::make_unique<Scheduler>(core->config_.scheduler, kvc);
  return core;
}

std::string EngineCore::kv_cache_summary() const {
  std::string gain;
  if (config_.kv_cache_dtype != KvCacheDtype::kF32) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2f",
                  static_cast<double>(f32_block_bytes_) / static_cast<double>(memory_.block_bytes));
    gain = ", " + std::string(ratio) + "x the tokens of a float32 cache";
  }
  const int64_t num_blocks = init_.num_blocks;
  std::string draft;
  if (memory_.draft_block_bytes > 0) {
    draft = "; the draft model's: " + std::to_string(num_blocks * 9 / 8) + " blocks of " +
            std::to_string(memory_.draft_block_bytes) + " bytes from the same memory";
  }
  return "KV cache: " + std::to_string(num_blocks) + " blocks of " + std::to_string(config_.block_size) +
         " tokens (" + std::string(kv_cache_dtype_name(config_.kv_cache_dtype)) + ", " +
         std::to_string(memory_.block_bytes) + " bytes each" + gain + "), up to " +
         std::to_string(num_blocks * config_.block_size) + " tokens at once; sized by " + kv_sizing_ + draft;
}

std::string EngineCore::speculative_summary() const {
  if (!config_.speculative.enabled()) return "";
  const SpeculativeConfig& s = config_.speculative;
  std::string text = "Speculative decoding: " + (speculation_.empty() ? s.method : speculation_);
  if (s.disable_by_batch_size > 0) {
    text += ", off in steps of more than " + std::to_string(s.disable_by_batch_size) + " sequences";
  }
  return text;
}

RequestLimits EngineCore::request_limits() const {
  return RequestLimits{executor_->config().vocab_size, config_.scheduler.max_model_len, config_.max_logprobs};
}

Status EngineCore::prepare(GenerateRequest& r) const {
  if (r.prompt_token_ids.empty()) r.prompt_token_ids = tokenizer_->encode(r.prompt, r.add_special_tokens);
  if (std::optional<RequestError> bad = validate_request(r, request_limits())) return invalid_argument(bad->message);
  return Status::ok_status();
}

Status EngineCore::add_request(RequestId id, const GenerateRequest& r) {
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
  std::vector<RequestId> added;
  for (int64_t i = 0; i < r.params.n; ++i) {
    const RequestId seq_id = next_seq_id_++;
    auto req = std::make_unique<Request>();
    req->id = seq_id;
    req->prompt_tokens = r.prompt_token_ids;
    req->stop = StopRules{r.params.max_tokens, r.params.min_tokens, stop_ids};
    req->priority = r.priority;
    req->arrival_seq = next_arrival_++;
    req->cache_salt = r.cache_salt;
    req->use_prefix_cache = !r.params.prompt_logprobs.has_value();
    const uint64_t seed = r.params.seed ? *r.params.seed + static_cast<uint64_t>(i) : mix_seed(config_.seed, seq_id);
    executor_->add_request(seq_id, r.params, seed, stop_ids, r.cache_salt);
    Status st = scheduler_->add_request(std::move(req));
    if (!st.ok()) {
      executor_->remove_request(seq_id);
      for (RequestId done : added) {
        scheduler_->finish_request(done, FinishReason::kAbort);
        executor_->remove_request(done);
        seqs_.erase(done);
      }
      return st;
    }
    Sequence s;
    s.parent = id;
    s.index = i;
    s.prompt_tokens = static_cast<int64_t>(r.prompt_token_ids.size());
    s.output = std::make_unique<SequenceOutput>(*tokenizer_, r.params.stop, r.params.include_stop_str_in_output,
                                                r.params.skip_special_tokens, after_text);
    s.want_logprobs = r.params.logprobs.has_value();
    s.want_prompt_logprobs = r.params.prompt_logprobs.has_value();
    s.arrival = now;
    seqs_.emplace(seq_id, std::move(s));
    added.push_back(seq_id);
  }
  children_[id] = std::move(added);
  return Status::ok_status();
}

double EngineCore::since(const Sequence& s) const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - s.arrival).count();
}

OutputChunk EngineCore::finish_chunk(RequestId seq_id, Sequence& s, FinishReason reason, TokenId stop_token) {
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
  executor_->remove_request(seq_id);
  record_finished(c);
  auto& siblings = children_[s.parent];
  siblings.erase(std::remove(siblings.begin(), siblings.end(), seq_id), siblings.end());
  if (siblings.empty()) children_.erase(s.parent);
  return c;
}

void EngineCore::record_finished(const OutputChunk& last) {
  if (!metrics_) return;
  metrics_->record_finished(finish_reason_name(last.finish_reason), last.prompt_tokens, last.completion_tokens,
                            last.timings.queued_s, last.timings.first_token_s, last.timings.finished_s, metrics_engine_);
}

std::vector<OutputChunk> EngineCore::abort(RequestId id, FinishReason reason) {
  std::vector<OutputChunk> out;
  auto it = children_.find(id);
  if (it == children_.end()) return out;
  const std::vector<RequestId> seq_ids = it->second;
  for (RequestId seq_id : seq_ids) {
    scheduler_->finish_request(seq_id, reason);
    auto s = seqs_.find(seq_id);
    out.push_back(finish_chunk(seq_id, s->second, reason, -1));
    seqs_.erase(s);
  }
  return out;
}

std::vector<OutputChunk> EngineCore::step(const std::function<void()>& on_scheduled) {
  // vLLM's batch queue: while fewer steps than the executor runs at once are in flight, schedule
  // one more (the scheduler leaves out the requests whose output is still to come) and submit
  // it; return at once if there is room for another, else take the oldest step's output.
  const size_t depth = static_cast<size_t>(executor_->max_in_flight());
  if (in_flight_.size() < depth) {
    // A pipeline overlaps its stages only with its requests split over the steps in flight: each
    // step takes at most its share of them.
    const int64_t share = depth > 1 ? (scheduler_->num_unfinished() + static_cast<int64_t>(depth) - 1) /
                                          static_cast<int64_t>(depth)
                                    : 0;
    SchedulerOutput scheduled = scheduler_->schedule(share);
    if (on_scheduled) on_scheduled();
    if (scheduled.empty()) executor_->preempted(scheduled.preempted);
    if (!scheduled.empty()) {
      for (const ScheduledSeq& seq : scheduled.seqs) {
        Sequence& s = seqs_.at(seq.request_id);
        if (s.queued_s < 0) s.queued_s = since(s);
      }
      if (Status st = executor_->submit(scheduled); !st.ok()) {
        throw std::runtime_error("the engine's workers failed: " + st.message());
      }
      in_flight_.push_back(std::move(scheduled));
      if (in_flight_.size() < depth) return {};
    }
  }
  if (in_flight_.empty()) {
    tell_workers_if_idle();
    record_step(0);
    return {};
  }
  const SchedulerOutput scheduled = std::move(in_flight_.front());
  in_flight_.pop_front();
  Result<ModelRunnerOutput> executed = executor_->collect();
  if (!executed.ok()) throw std::runtime_error("the engine's workers failed: " + executed.status().message());
  ModelRunnerOutput produced = std::move(executed).value();
  for (PromptLogprobsOutput& p : produced.prompt_logprobs) {
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
  for (const SpecDecodeCounts& c : produced.spec) {
    ++spec_stats_.num_drafts;
    spec_stats_.num_draft_tokens += c.num_draft_tokens;
    spec_stats_.num_accepted_tokens += c.num_accepted;
    auto& per_pos = spec_stats_.num_accepted_per_pos;
    if (per_pos.size() < static_cast<size_t>(c.num_draft_tokens)) per_pos.resize(static_cast<size_t>(c.num_draft_tokens), 0);
    for (int64_t i = 0; i < c.num_accepted; ++i) ++per_pos[static_cast<size_t>(i)];
    if (metrics_) metrics_->record_spec_decode(c.num_draft_tokens, c.num_accepted, metrics_engine_);
  }
  // The update also hands the scheduler the next step's drafts, which the workers proposed after
  // sampling (a prompt's first token waits for the draft model's pass over the prompt, as in vLLM,
  // and counts it in its time to first token).
  std::vector<RequestUpdate> updates = scheduler_->update_from_output(scheduled, produced);

  std::vector<OutputChunk> chunks;
  for (RequestUpdate& u : updates) {
    auto it = seqs_.find(u.request_id);
    PAGODA_CHECK(it != seqs_.end());
    Sequence& s = it->second;
    s.num_cached_tokens = u.num_cached_tokens;
    const auto now = std::chrono::steady_clock::now();
    if (!u.new_tokens.empty() && metrics_) {
      if (s.first_token_s < 0) {
        metrics_->record_tokens(s.prompt_tokens, 0, metrics_engine_);
      } else {
        metrics_->record_inter_token(std::chrono::duration<double>(now - s.last_token).count(), metrics_engine_);
      }
      metrics_->record_tokens(0, static_cast<int64_t>(u.new_tokens.size()), metrics_engine_);
    }
    if (!u.new_tokens.empty()) s.last_token = now;
    if (s.first_token_s < 0) s.first_token_s = since(s);
    FinishReason reason = u.finish_reason;
    OutputChunk c;
    c.request_id = s.parent;
    c.index = s.index;
    for (size_t i = 0; i < u.new_tokens.size(); ++i) {
      const TokenId t = u.new_tokens[i];
      ++s.num_output_tokens;
      c.token_ids.push_back(t);
      if (s.want_logprobs) c.logprobs.push_back(u.samples[i]);
      if (reason == FinishReason::kStop && t == u.stop_token) continue;  // a stop id shows no text
      if (s.output->push(t)) {
        // A stop string ends the sequence here: tokens after it (accepted drafts) are dropped.
        if (reason == FinishReason::kNone) scheduler_->finish_request(u.request_id, FinishReason::kStop);
        reason = FinishReason::kStop;
        u.stop_token = -1;
        break;
      }
    }
    if (s.want_prompt_logprobs) c.prompt_logprobs = std::move(s.pending_prompt_logprobs);
    s.pending_prompt_logprobs.clear();
    if (reason != FinishReason::kNone) {
      OutputChunk last = finish_chunk(u.request_id, s, reason, u.stop_token);
      last.token_ids = std::move(c.token_ids);
      last.logprobs = std::move(c.logprobs);
      last.prompt_logprobs = std::move(c.prompt_logprobs);
      chunks.push_back(std::move(last));
      seqs_.erase(it);
    } else {
      c.text = s.output->take_ready_text();
      chunks.push_back(std::move(c));
    }
  }
  tell_workers_if_idle();
  record_step(scheduled.num_scheduled_tokens);
  return chunks;
}

void EngineCore::tell_workers_if_idle() {
  // The workers still hold requests that ended (or were preempted) since the last step; with
  // nothing left to run, a step of nothing tells them, so they let go now rather than with the
  // next request.
  if (!in_flight_.empty() || scheduler_->has_unfinished() || !executor_->has_notices()) return;
  Result<ModelRunnerOutput> told = executor_->execute(SchedulerOutput{});
  if (!told.ok()) throw std::runtime_error("the engine's workers failed: " + told.status().message());
}

void EngineCore::record_step(int64_t scheduled_tokens) {
  if (!metrics_) return;
  const SchedulerStats st = scheduler_->stats();
  metrics_->record_step(st.num_running, st.num_waiting, st.kv_usage, static_cast<uint64_t>(st.prefix_cache.queries),
                        static_cast<uint64_t>(st.prefix_cache.hits), static_cast<uint64_t>(st.num_preemptions),
                        scheduled_tokens, metrics_engine_);
}

}  // namespace pagoda
