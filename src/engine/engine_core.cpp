#include "engine/engine_core.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>

#include "base/check.h"
#include "base/memory_info.h"
#include "engine/request_validation.h"
#include "kv/kv_cache_manager.h"
#include "executor/group_executor.h"
#include "speculative/draft_model_proposer.h"
#include "speculative/ngram_proposer.h"

namespace pagoda {

namespace {

// The forward pass's working memory at the scheduler's limits: the model's per-token buffers
// (x, h, q, attention out, k, v, gate, up; a sparse layer's router logits and, per routing slot,
// the gathered row, the expert's gate, up and output rows and the slot's bookkeeping:
// model/layers/workspace.h) for a full step, and one logit row per sequence.
int64_t activation_bytes(const ModelConfig& c, const SchedulerConfig& sc) {
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  int64_t per_token = 2 * c.hidden_size + 2 * q + 2 * kv + 2 * c.max_intermediate_size();
  if (c.num_experts > 0) {
    per_token += c.num_experts + c.num_experts_per_tok * (2 * c.hidden_size + 2 * c.moe_intermediate_size + 2 + 2 + 1);
  }
  return static_cast<int64_t>(sizeof(float)) * (sc.max_num_batched_tokens * per_token + sc.max_num_seqs * c.vocab_size);
}

std::string gib(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  return buf;
}

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

Result<std::unique_ptr<EngineCore>> EngineCore::create(std::unique_ptr<Model> model,
                                                       std::shared_ptr<const Tokenizer> tokenizer,
                                                       const EngineConfig& config,
                                                       std::unique_ptr<Model> draft_model) {
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->config_ = config;
  core->tokenizer_ = std::move(tokenizer);
  const ModelConfig& mc = model->config();
  SchedulerConfig& sc = core->config_.scheduler;
  if (sc.max_model_len == 0) sc.max_model_len = mc.max_position_embeddings;
  if (sc.max_model_len < 1 || sc.max_model_len > mc.max_position_embeddings) {
    return invalid_argument("--max-model-len must be in [1, " + std::to_string(mc.max_position_embeddings) +
                            "] (the model's context length)");
  }
  if (config.block_size < 1 || config.block_size > 256) return invalid_argument("--block-size must be in [1, 256]");
  if (sc.max_num_seqs < 1) return invalid_argument("--max-num-seqs must be at least 1");
  if (sc.max_num_batched_tokens < 1) return invalid_argument("--max-num-batched-tokens must be at least 1");
  if (sc.long_prefill_token_threshold < 0) return invalid_argument("--long-prefill-token-threshold must be >= 0");

  if (!sc.enable_chunked_prefill && sc.max_num_batched_tokens < sc.max_model_len) {
    return invalid_argument("--max-num-batched-tokens (" + std::to_string(sc.max_num_batched_tokens) +
                            ") is smaller than --max-model-len (" + std::to_string(sc.max_model_len) +
                            "): without chunked prefill a long prompt could never be scheduled; raise "
                            "--max-num-batched-tokens, lower --max-model-len, or enable chunked prefill");
  }
  if (config.gpu_memory_utilization != 0 && !(config.gpu_memory_utilization > 0 && config.gpu_memory_utilization <= 1)) {
    return invalid_argument("--gpu-memory-utilization must be in (0, 1], got " +
                            std::to_string(config.gpu_memory_utilization));
  }

  SpeculativeConfig& spec = core->config_.speculative;
  if (spec.method == "ngram") {
    if (spec.prompt_lookup_min == 0 && spec.prompt_lookup_max == 0) spec.prompt_lookup_min = spec.prompt_lookup_max = 5;
    if (spec.prompt_lookup_min == 0) spec.prompt_lookup_min = spec.prompt_lookup_max;
    if (spec.prompt_lookup_max == 0) spec.prompt_lookup_max = spec.prompt_lookup_min;
    const NgramProposerConfig ngram{spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max};
    if (Status st = ngram.validate(); !st.ok()) return invalid_argument("--speculative-config: " + st.message());
    core->proposer_ = std::make_unique<NgramProposer>(ngram);
  } else if (spec.method == "draft_model") {
    const std::string name = "--speculative-config: draft model " + spec.model;
    if (!draft_model) return invalid_argument(name + ": not loaded");
    const ModelConfig& dc = draft_model->config();
    if (dc.vocab_size != mc.vocab_size) {
      return invalid_argument(name + " has a vocabulary of " + std::to_string(dc.vocab_size) + " tokens, the model " +
                              std::to_string(mc.vocab_size) + ": a draft must share the model's vocabulary");
    }
    if (dc.max_position_embeddings < sc.max_model_len) {
      return invalid_argument(name + " has a context of " + std::to_string(dc.max_position_embeddings) +
                              " tokens, shorter than --max-model-len " + std::to_string(sc.max_model_len) +
                              "; lower --max-model-len or use a draft with a longer context");
    }
    if (spec.num_speculative_tokens < 1 || spec.num_speculative_tokens > NgramProposerConfig::kMaxSpeculativeTokens) {
      return invalid_argument("--speculative-config: num_speculative_tokens must be in [1, " +
                              std::to_string(NgramProposerConfig::kMaxSpeculativeTokens) + "], got " +
                              std::to_string(spec.num_speculative_tokens));
    }
  } else if (!spec.method.empty()) {
    return invalid_argument("--speculative-config: method '" + spec.method +
                            "' is not supported (supported: ngram, draft_model)");
  }
  if (spec.disable_by_batch_size < 0) return invalid_argument("--speculative-config: disable_by_batch_size must be >= 0");

  const int64_t bs = config.block_size;
  // What this process holds of the model: under tensor parallelism its rank's KV heads.
  const ModelConfig& shard = model->shard_config();
  core->bytes_per_block_ = KvCacheTensors::bytes_per_block(shard, bs, config.kv_cache_dtype);
  // A draft model's cache: 9 blocks for every 8 of the target's (its drafts run ahead of the
  // target's tokens); a request it has no room for gets no drafts that step.
  const int64_t draft_block_bytes =
      draft_model ? KvCacheTensors::bytes_per_block(draft_model->config(), bs, config.kv_cache_dtype) : 0;
  const int64_t per_block = core->bytes_per_block_ + draft_block_bytes * 9 / 8;
  const int64_t blocks_per_seq = (sc.max_model_len + bs - 1) / bs;
  const int64_t one_seq = blocks_per_seq * per_block;
  int64_t memory = config.kv_cache_memory;
  if (memory > 0) {
    core->kv_sizing_ = "--kv-cache-memory-bytes";
  } else if (config.gpu_memory_utilization > 0) {
    // vLLM's rule, with the machine's memory in place of the GPU's: the engine may use this
    // fraction for weights + activations + KV cache; the KV cache gets what is left.
    const double total = static_cast<double>(total_memory_bytes());
    const double share = 1.0 / std::max(1, config.replicas_on_host);
    const double allowed = config.gpu_memory_utilization * total * share;
    double weights = static_cast<double>(model->weight_bytes());
    double activations = static_cast<double>(activation_bytes(shard, sc));
    if (draft_model) {
      weights += static_cast<double>(draft_model->weight_bytes());
      activations += static_cast<double>(activation_bytes(draft_model->config(), sc));
    }
    const double left = allowed - weights - activations;
    char fraction[32];
    std::snprintf(fraction, sizeof fraction, "%g", config.gpu_memory_utilization);
    const std::string replicas =
        config.replicas_on_host > 1 ? " / " + std::to_string(config.replicas_on_host) + " replicas on this host" : "";
    const std::string account = fraction + std::string(" of the machine's ") + gib(total) + replicas + " = " + gib(allowed) +
                                ", less " + gib(weights) + " of weights and " + gib(activations) + " of activations";
    if (left < static_cast<double>(one_seq)) {
      return invalid_argument("--gpu-memory-utilization " + std::string(fraction) + " leaves " +
                              gib(std::max(left, 0.0)) + " for the KV cache (" + account +
                              "), but one sequence of --max-model-len " + std::to_string(sc.max_model_len) + " needs " +
                              gib(static_cast<double>(one_seq)) +
                              "; raise --gpu-memory-utilization or lower --max-model-len");
    }
    memory = static_cast<int64_t>(std::min(left, 9.0e18));
    core->kv_sizing_ = "--gpu-memory-utilization " + account;
  } else {
    const double all_seqs = static_cast<double>(blocks_per_seq) * static_cast<double>(sc.max_num_seqs) *
                            static_cast<double>(per_block);
    const int replicas = std::max(1, config.replicas_on_host);
    memory = static_cast<int64_t>(std::min(all_seqs, available_memory_bytes() / 4.0 / replicas));
    core->kv_sizing_ = "default: a quarter of the available memory" +
                       (replicas > 1 ? " shared by " + std::to_string(replicas) + " replicas" : std::string()) +
                       ", at most --max-num-seqs full sequences";
  }
  core->num_blocks_ = memory / per_block;
  if (core->num_blocks_ < blocks_per_seq) {
    return invalid_argument("the KV cache (" + std::to_string(memory) + " bytes, " +
                            std::to_string(core->num_blocks_ * bs) + " tokens) cannot hold one sequence of --max-model-len " +
                            std::to_string(sc.max_model_len) + " tokens; raise --kv-cache-memory-bytes or lower --max-model-len");
  }
  if (core->num_blocks_ > (int64_t{1} << 30)) core->num_blocks_ = int64_t{1} << 30;
  PAGODA_ASSIGN_OR_RETURN(KvCacheTensors kv,
                          KvCacheTensors::allocate(shard, core->num_blocks_, bs, config.kv_cache_dtype));
  auto runner = std::make_unique<ModelRunner>(std::move(model), std::move(kv));
  if (const ParallelGroup& g = config.parallel_group; g.world != nullptr && g.pipeline_stages > 1) {
    if (g.sender == nullptr) return internal_error("a pipeline-parallel group without its SendQueue");
    PAGODA_ASSIGN_OR_RETURN(core->executor_, PipelineExecutor::create(*g.world, *g.sender, g.pipeline_stages,
                                                                      g.output_rank, std::move(runner)));
  } else if (g.world != nullptr && g.world->size() > 1) {
    PAGODA_ASSIGN_OR_RETURN(core->executor_, GroupExecutor::create(*g.world, std::move(runner)));
  } else {
    core->executor_ = std::make_unique<LocalExecutor>(std::move(runner), config.serialize_steps, config.steps_in_flight);
  }
  if (draft_model || !spec.method.empty()) {
    if (core->executor_->max_in_flight() > 1) {
      return invalid_argument("speculative decoding with pipeline parallelism: the drafts of a request need its "
                              "last token, which is still in the pipeline; use one or the other");
    }
  }
  if (draft_model) {
    const int64_t draft_blocks = core->num_blocks_ * 9 / 8;
    PAGODA_ASSIGN_OR_RETURN(KvCacheTensors draft_kv, KvCacheTensors::allocate(draft_model->config(), draft_blocks, bs,
                                                                              config.kv_cache_dtype));
    core->draft_kv_ = "; the draft model's: " + std::to_string(draft_blocks) + " blocks of " +
                      std::to_string(draft_block_bytes) + " bytes from the same memory";
    DraftModelProposerConfig dc{spec.model, spec.num_speculative_tokens, sc.max_num_batched_tokens,
                                config.enable_prefix_caching};
    core->proposer_ = std::make_unique<DraftModelProposer>(std::move(draft_model), std::move(draft_kv), dc);
  }
  KvCacheConfig kvc{static_cast<int32_t>(core->num_blocks_), config.block_size, config.enable_prefix_caching};
  core->scheduler_ = std::make_unique<Scheduler>(sc, kvc);
  return core;
}

Result<std::unique_ptr<EngineCore>> EngineCore::create_replica(const EngineCore& like,
                                                               std::unique_ptr<Executor> executor) {
  const SpeculativeConfig& spec = like.config_.speculative;
  if (spec.method == "draft_model") {
    return invalid_argument("--speculative-config draft_model with --data-parallel-size > 1 is not supported (the "
                            "draft runs next to each replica's scheduler); use ngram, or one replica");
  }
  if (!spec.method.empty() && executor->max_in_flight() > 1) {
    return invalid_argument("speculative decoding with pipeline parallelism: the drafts of a request need its "
                            "last token, which is still in the pipeline; use one or the other");
  }
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->config_ = like.config_;
  core->tokenizer_ = like.tokenizer_;
  core->executor_ = std::move(executor);
  core->num_blocks_ = like.num_blocks_;
  core->bytes_per_block_ = like.bytes_per_block_;
  core->kv_sizing_ = like.kv_sizing_;
  if (spec.method == "ngram") {
    core->proposer_ = std::make_unique<NgramProposer>(
        NgramProposerConfig{spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max});
  }
  KvCacheConfig kvc{static_cast<int32_t>(core->num_blocks_), core->config_.block_size,
                    core->config_.enable_prefix_caching};
  core->scheduler_ = std::make_unique<Scheduler>(core->config_.scheduler, kvc);
  return core;
}

std::string EngineCore::kv_cache_summary() const {
  const ModelConfig& mc = executor_->config();
  std::string gain;
  if (config_.kv_cache_dtype != KvCacheDtype::kF32) {
    char ratio[32];
    std::snprintf(ratio, sizeof ratio, "%.2f",
                  static_cast<double>(KvCacheTensors::bytes_per_block(mc, config_.block_size, KvCacheDtype::kF32)) /
                      static_cast<double>(bytes_per_block_));
    gain = ", " + std::string(ratio) + "x the tokens of a float32 cache";
  }
  return "KV cache: " + std::to_string(num_blocks_) + " blocks of " + std::to_string(config_.block_size) +
         " tokens (" + std::string(kv_cache_dtype_name(config_.kv_cache_dtype)) + ", " + std::to_string(bytes_per_block_) +
         " bytes each" + gain + "), up to " + std::to_string(num_blocks_ * config_.block_size) +
         " tokens at once; sized by " + kv_sizing_ + draft_kv_;
}

std::string EngineCore::speculative_summary() const {
  if (!proposer_) return "";
  const SpeculativeConfig& s = config_.speculative;
  std::string text = "Speculative decoding: " + proposer_->describe();
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
    executor_->add_request(seq_id, r.params, seed, stop_ids);
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
  if (proposer_) proposer_->forget(seq_id);
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
    if (proposer_) {
      for (RequestId id : scheduled.preempted) proposer_->forget(id);
    }
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
  std::vector<RequestUpdate> updates = scheduler_->update_from_output(scheduled, produced);
  // The next step's drafts now, before this step's tokens are stamped: they reach the caller when
  // step() returns, after the draft model's pass (a prompt's first token waits for the draft's
  // pass over the prompt, as in vLLM, and counts it in its time to first token). A request that a
  // stop string ends below drafted for nothing; finish_chunk has the proposer forget it.
  if (proposer_) propose_drafts();

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
  record_step(scheduled.num_scheduled_tokens);
  return chunks;
}

void EngineCore::propose_drafts() {
  const SpeculativeConfig& spec = config_.speculative;
  if (spec.disable_by_batch_size > 0 && scheduler_->stats().num_running > spec.disable_by_batch_size) return;
  std::vector<ProposalRequest> requests;
  for (const auto& entry : seqs_) {
    const RequestId seq_id = entry.first;
    const Request* r = scheduler_->find(seq_id);
    if (r == nullptr || r->status != RequestStatus::kRunning) continue;
    ProposalRequest p{seq_id, r->all_tokens, r->num_computed_tokens, 0, r->cache_salt};
    if (r->num_computed_tokens == r->num_tokens() - 1) {
      // Room left: positions up to max_model_len - 1, and no more tokens than max_tokens allows
      // (a step emits the drafts it accepts plus one).
      p.max_drafts = std::max<int64_t>(0, std::min({spec.num_speculative_tokens,
                                                    config_.scheduler.max_model_len - r->num_tokens(),
                                                    r->stop.max_tokens - r->num_output_tokens() - 1}));
    }
    requests.push_back(p);
  }
  // Proposals depend on each request alone; a fixed order keeps the draft model's batches, and
  // so its floating-point sums, the same from run to run.
  std::sort(requests.begin(), requests.end(), [](const ProposalRequest& a, const ProposalRequest& b) { return a.id < b.id; });
  std::vector<std::vector<TokenId>> drafts = proposer_->propose(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!drafts[i].empty()) scheduler_->set_draft_tokens(requests[i].id, std::move(drafts[i]));
  }
}

void EngineCore::record_step(int64_t scheduled_tokens) {
  if (!metrics_) return;
  const SchedulerStats st = scheduler_->stats();
  metrics_->record_step(st.num_running, st.num_waiting, st.kv_usage, static_cast<uint64_t>(st.prefix_cache.queries),
                        static_cast<uint64_t>(st.prefix_cache.hits), static_cast<uint64_t>(st.num_preemptions),
                        scheduled_tokens, metrics_engine_);
}

}  // namespace pagoda
