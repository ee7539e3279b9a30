#include "engine/engine_core.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "engine/kv_cache_sizing.h"
#include "kv_transfer/kv_connector_factory.h"
#include "kv_transfer/remote_connector.h"

namespace pagoda {

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

namespace {

// The KV connector's halves for an engine of `config` on `executor`'s workers, whose shard of a
// block is `block_bytes`.
Result<KvConnectorPlan> plan_connector(const EngineConfig& config, const Executor& executor, int64_t block_bytes) {
  const std::string flag = config.kv_transfer.offloading() ? "--kv-offloading-size / --kv-transfer-config"
                                                           : "--kv-transfer-config";
  if (!config.enable_prefix_caching && config.kv_transfer.offloading()) {
    return invalid_argument(flag + ": the offloaded blocks are found by their prefix; it needs prefix caching on "
                                   "(drop --no-enable-prefix-caching)");
  }
  if (executor.max_in_flight() > 1) {
    return invalid_argument(flag + " with pipeline parallelism is not supported (--pipeline-parallel-size 1)");
  }
  if (config.speculative.uses_draft_model()) {
    // The draft model keeps a KV cache of its own, which loaded blocks would not fill.
    return invalid_argument(flag + " with a draft model (--speculative-config) is not supported yet; n-gram "
                                   "speculation works with it");
  }
  const bool disk = config.kv_transfer.offloading() && !config.kv_transfer.offloading_part()->disk_path.empty();
  if ((disk || config.kv_transfer.remote()) && config.model_fingerprint == Sha256Digest{}) {
    return invalid_argument(flag + ": a disk tier or a transfer between instances needs the model's fingerprint, which this engine was not given");
  }
  // The blocks belong to these weights in this layout: a file of another model, KV dtype, block
  // size or tensor-parallel split has another fingerprint, and no key of this chain.
  const ModelConfig& m = executor.config();
  Sha256 h;
  h.update(std::string_view("pagoda kv layout v1"));
  h.update(std::span<const uint8_t>(config.model_fingerprint));
  const int64_t layout[] = {m.num_layers, m.num_kv_heads, m.head_dim, m.vocab_size, config.block_size,
                            static_cast<int64_t>(config.kv_cache_dtype), block_bytes, executor.tensor_parallel_size()};
  h.update(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(layout), sizeof layout));
  h.update(std::string_view(m.architecture));
  KvConnectorSetup setup;
  setup.transfer_fingerprint = transfer_fingerprint(config.model_fingerprint, config.kv_cache_dtype, config.block_size,
                                                    m.num_layers, m.num_kv_heads, m.head_dim);
  char hex[9];
  std::snprintf(hex, sizeof hex, "%02x%02x%02x%02x", config.model_fingerprint[0], config.model_fingerprint[1],
                config.model_fingerprint[2], config.model_fingerprint[3]);
  setup.transfer_description = "weights " + std::string(hex) + ", KV " +
                               std::string(kv_cache_dtype_name(config.kv_cache_dtype)) + " in blocks of " +
                               std::to_string(config.block_size) + " tokens, " + std::to_string(m.num_layers) +
                               " layers of " + std::to_string(m.num_kv_heads) + " KV heads of " +
                               std::to_string(m.head_dim);
  setup.block_size = config.block_size;
  setup.block_bytes = block_bytes;
  setup.tensor_parallel_size = executor.tensor_parallel_size();
  setup.fingerprint = h.finish();
  return make_kv_connector(config.kv_transfer, setup);
}

}  // namespace

Result<std::unique_ptr<EngineCore>> EngineCore::create(std::unique_ptr<Executor> executor,
                                                       const EngineConfig& config) {
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->config_ = config;
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
                           c.scheduler.max_num_batched_tokens, c.enable_prefix_caching, {}};
  std::unique_ptr<KvConnectorScheduler> connector;
  if (c.kv_transfer.enabled()) {
    PAGODA_ASSIGN_OR_RETURN(KvConnectorPlan kv_plan, plan_connector(c, *executor, memory.block_bytes));
    connector = std::move(kv_plan.scheduler);
    core->init_.kv_connector = kv_plan.worker;
    core->connector_summary_ = kv_plan.summary;
  }
  PAGODA_RETURN_IF_ERROR(executor->initialize(core->init_));
  core->speculation_ = executor->proposer_description();
  core->executor_ = std::move(executor);
  KvCacheConfig kvc{static_cast<int32_t>(plan.num_blocks), c.block_size, c.enable_prefix_caching};
  core->scheduler_ = std::make_unique<Scheduler>(c.scheduler, kvc, std::move(connector));
  return core;
}

Result<std::unique_ptr<EngineCore>> EngineCore::create_replica(const EngineCore& like,
                                                               std::unique_ptr<Executor> executor) {
  if (like.config_.speculative.enabled() && executor->max_in_flight() > 1) {
    return invalid_argument("speculative decoding with pipeline parallelism: the drafts of a request need its "
                            "last token, which is still in the pipeline; use one or the other");
  }
  if (like.config_.kv_transfer.enabled()) {
    return invalid_argument("--kv-transfer-config with --data-parallel-size > 1 is not supported yet");
  }
  std::unique_ptr<EngineCore> core(new EngineCore());
  core->config_ = like.config_;
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

Status EngineCore::add_request(CoreRequest r) {
  auto req = std::make_unique<Request>();
  req->id = r.id;
  req->prompt_tokens = std::move(r.prompt_token_ids);
  req->max_tokens = r.params.max_tokens;
  req->priority = r.priority;
  req->arrival_seq = next_arrival_++;
  req->cache_salt = r.cache_salt;
  req->use_prefix_cache = r.use_prefix_cache;
  // A decode instance's request loads its prompt from the prefill instance only when that holds
  // exactly this prompt and every prompt row need not be computed here (prompt logprobs); else
  // it is an ordinary request.
  int64_t skip_draws = 0;
  if (r.kv_transfer && r.kv_transfer->do_remote_prefill) {
    const bool usable = config_.kv_transfer.consumer() && r.use_prefix_cache &&
                        r.kv_transfer->remote_num_tokens == static_cast<int64_t>(req->prompt_tokens.size());
    if (!usable) r.kv_transfer.reset();
    // The prefill instance drew the first token from this request's generator: continue after it.
    if (usable && r.kv_transfer->first_token && !r.params.greedy()) skip_draws = 1;
  }
  if (r.kv_transfer && r.kv_transfer->do_remote_decode && !config_.kv_transfer.producer()) r.kv_transfer.reset();
  req->kv_transfer = r.kv_transfer;
  if (r.constraint) {
    const int64_t vocab = executor_->config().vocab_size;
    if (r.constraint->grammar->vocabulary().size() != vocab) {
      return invalid_argument("a grammar over " + std::to_string(r.constraint->grammar->vocabulary().size()) +
                              " tokens for a model of " + std::to_string(vocab));
    }
  }
  PAGODA_RETURN_IF_ERROR(scheduler_->add_request(std::move(req)));
  executor_->add_request(r.id, r.params, r.seed, r.min_tokens_suppressed, r.cache_salt, skip_draws);
  if (r.constraint) {
    if (!structured_) {
      structured_ = std::make_unique<StructuredOutputs>(static_cast<size_t>(executor_->config().vocab_size + 63) / 64);
    }
    structured_->add(r.id, r.constraint->grammar, r.starts_text, r.constraint->after_token, r.min_tokens_suppressed);
  }
  return Status::ok_status();
}

void EngineCore::finish_requests(std::span<const RequestId> ids) {
  for (RequestId id : ids) {
    scheduler_->finish_request(id);
    executor_->remove_request(id);
    if (structured_) structured_->remove(id);
  }
  tell_workers_if_idle();
}

CoreStepOutput EngineCore::step(const std::function<void()>& on_scheduled) {
  CoreStepOutput out;
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
    out.scheduled_at = std::chrono::steady_clock::now();
    if (on_scheduled) on_scheduled();
    if (scheduled.empty()) executor_->preempted(scheduled.preempted);
    if (!scheduled.empty()) {
      // The sequences that may be scheduled for the first time (the output processor times
      // their queueing): a sequence has no output before its first schedule.
      for (const ScheduledSeq& seq : scheduled.seqs) {
        if (seq.output_tokens.empty()) out.scheduled.push_back(seq.request_id);
      }
      if (structured_) structured_->fill_masks(scheduled);
      if (Status st = executor_->submit(scheduled); !st.ok()) {
        throw std::runtime_error("the engine's workers failed: " + st.message());
      }
      in_flight_.push_back(std::move(scheduled));
      if (in_flight_.size() < depth) return out;
    }
  }
  if (in_flight_.empty()) {
    tell_workers_if_idle();
    return out;
  }
  const SchedulerOutput scheduled = std::move(in_flight_.front());
  in_flight_.pop_front();
  Result<ModelRunnerOutput> executed = executor_->collect();
  if (!executed.ok()) throw std::runtime_error("the engine's workers failed: " + executed.status().message());
  ModelRunnerOutput produced = std::move(executed).value();
  for (const SpecDecodeCounts& c : produced.spec) {
    ++spec_stats_.num_drafts;
    spec_stats_.num_draft_tokens += c.num_draft_tokens;
    spec_stats_.num_accepted_tokens += c.num_accepted;
    auto& per_pos = spec_stats_.num_accepted_per_pos;
    if (per_pos.size() < static_cast<size_t>(c.num_draft_tokens)) per_pos.resize(static_cast<size_t>(c.num_draft_tokens), 0);
    for (int64_t i = 0; i < c.num_accepted; ++i) ++per_pos[static_cast<size_t>(i)];
  }
  // The update also hands the scheduler the next step's drafts, which the workers proposed after
  // sampling (a prompt's first token waits for the draft model's pass over the prompt, as in vLLM,
  // and counts it in its time to first token).
  out.updates = scheduler_->update_from_output(scheduled, produced);
  if (structured_) structured_->accept(out.updates);
  out.prompt_logprobs = std::move(produced.prompt_logprobs);
  out.spec = std::move(produced.spec);
  out.num_scheduled_tokens = scheduled.num_scheduled_tokens;
  return out;
}

void EngineCore::tell_workers_if_idle() {
  // The workers still hold requests that ended (or were preempted) since the last step; with
  // nothing left to run, a step of nothing tells them, so they let go now rather than with the
  // next request.
  if (!in_flight_.empty() || scheduler_->has_unfinished() || !executor_->has_notices()) return;
  Result<ModelRunnerOutput> told = executor_->execute(SchedulerOutput{});
  if (!told.ok()) throw std::runtime_error("the engine's workers failed: " + told.status().message());
}

}  // namespace pagoda
