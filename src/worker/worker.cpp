#include "worker/worker.h"

#include <algorithm>
#include <string>
#include <unordered_set>
#include <utility>

#include "base/check.h"
#include "kv_transfer/kv_connector_factory.h"
#include "speculative/draft_model_proposer.h"
#include "speculative/make_proposer.h"

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

// The forward pass's working memory at the scheduler's limits: the model's per-token buffers
// (x, h, q, attention out, k, v, gate, up; a sparse layer's router logits and, per routing slot,
// the gathered row, the expert's gate, up and output rows and the slot's bookkeeping:
// model/layers/workspace.h) for a full step, and one logit row per sequence.
int64_t activation_bytes(const ModelConfig& c, int64_t max_num_batched_tokens, int64_t max_num_seqs) {
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  int64_t per_token = 2 * c.hidden_size + 2 * q + 2 * kv + 2 * c.max_intermediate_size();
  if (c.num_experts > 0) {
    per_token += c.num_experts + c.num_experts_per_tok * (2 * c.hidden_size + 2 * c.moe_intermediate_size + 2 + 2 + 1);
  }
  return static_cast<int64_t>(sizeof(float)) * (max_num_batched_tokens * per_token + max_num_seqs * c.vocab_size);
}

}  // namespace

Worker::Worker(std::unique_ptr<Model> model, std::unique_ptr<Model> draft, WorkerRank rank)
    : runner_(std::make_unique<ModelRunner>(std::move(model))), draft_(std::move(draft)), rank_(rank) {}

const ModelConfig* Worker::draft_config() const {
  if (draft_) return &draft_->config();
  const auto* d = dynamic_cast<const DraftModelProposer*>(proposer_.get());
  return d != nullptr ? &d->model_config() : nullptr;
}

WorkerMemory Worker::memory(int64_t block_size, KvCacheDtype dtype, int64_t max_num_batched_tokens,
                            int64_t max_num_seqs) const {
  // What this process computes: under tensor parallelism its rank's KV heads.
  const Model& model = runner_->model();
  WorkerMemory m;
  m.block_bytes = KvCacheTensors::bytes_per_block(model.shard_config(), block_size, dtype);
  m.weight_bytes = model.weight_bytes();
  m.activation_bytes = activation_bytes(model.shard_config(), max_num_batched_tokens, max_num_seqs);
  if (draft_) {
    m.draft_block_bytes = KvCacheTensors::bytes_per_block(draft_->config(), block_size, dtype);
    m.weight_bytes += draft_->weight_bytes();
    m.activation_bytes += activation_bytes(draft_->config(), max_num_batched_tokens, max_num_seqs);
  }
  return m;
}

Status Worker::initialize(const WorkerInit& init) {
  if (initialized_) return internal_error("the worker was initialized already");
  const Model& model = runner_->model();
  PAGODA_ASSIGN_OR_RETURN(KvCacheTensors kv, KvCacheTensors::allocate(model.kernels(), model.shard_config(),
                                                                      init.num_blocks, init.block_size,
                                                                      init.kv_cache_dtype));
  // A draft model's cache: 9 blocks for every 8 of the target's (its drafts run ahead of the
  // target's tokens); a request it has no room for gets no drafts that step.
  const ProposerLimits limits{init.max_model_len, init.max_num_batched_tokens, init.enable_prefix_caching};
  PAGODA_ASSIGN_OR_RETURN(proposer_, make_proposer(init.speculative, limits, std::move(draft_), init.num_blocks * 9 / 8,
                                                   init.block_size, init.kv_cache_dtype));
  runner_->initialize_kv_cache(std::move(kv));
  if (!init.kv_connector.connector.empty()) {
    PAGODA_ASSIGN_OR_RETURN(connector_, make_kv_connector_worker(init.kv_connector, rank_.rank, rank_.size,
                                                                 runner_->kv_cache(), model.config().num_kv_heads));
    PAGODA_RETURN_IF_ERROR(connector_->register_kv_caches(runner_->kv_cache(), model.kernels()));
  }
  init_ = init;
  initialized_ = true;
  return Status::ok_status();
}

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
  if (!d.allowed_tokens.empty()) {
    const size_t words = (static_cast<size_t>(vocab) + 63) / 64;
    if (!d.sample || d.allowed_tokens.size() != words * static_cast<size_t>(num_drafts + 1)) {
      return data_loss(who + ": " + std::to_string(d.allowed_tokens.size()) + " words of token masks for " +
                       std::to_string(d.sample ? num_drafts + 1 : 0) + " sampled rows of " + std::to_string(words));
    }
    for (int64_t row = 0; row <= num_drafts; ++row) {
      const auto mask = std::span(d.allowed_tokens).subspan(static_cast<size_t>(row) * words, words);
      if (std::all_of(mask.begin(), mask.end(), [](uint64_t w) { return w == 0; })) {
        return data_loss(who + ": a token mask allows no token");
      }
    }
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
  if (!initialized_) return internal_error("step message " + std::to_string(m.step) + " before the worker's start");
  if (m.step != last_step_ + 1) {
    return data_loss("step message " + std::to_string(m.step) + " after step " + std::to_string(last_step_));
  }
  last_step_ = m.step;
  const int64_t vocab = runner_->config().vocab_size;
  for (RequestId id : m.finished) {
    if (!requests_.erase(id)) return data_loss("finished " + id_text(id) + " is unknown");
    if (proposer_) proposer_->forget(id);
  }
  for (RequestId id : m.preempted) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return data_loss("preempted " + id_text(id) + " is unknown");
    it->second.block_table.clear();
    if (proposer_) proposer_->forget(id);
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
    r.cache_salt = n.cache_salt;
    if (n.skip_draws < 0 || n.skip_draws > 1) return data_loss(who + ": " + std::to_string(n.skip_draws) + " draws to skip");
    r.sampling = SamplingState{n.params, SamplerRng(n.seed), n.min_tokens_suppressed};
    r.sampling.rng.discard(static_cast<unsigned long long>(n.skip_draws));
    requests_.emplace(n.request_id, std::move(r));
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
  std::vector<SamplingState*> states;
  states.reserve(m.scheduled.size());
  for (const ScheduledRequestData& d : m.scheduled) {
    RequestState& r = requests_.at(d.request_id);
    states.push_back(&r.sampling);
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
    seq.allowed_tokens = d.allowed_tokens;
    scheduled.num_scheduled_tokens += d.num_scheduled_tokens;
    scheduled.seqs.push_back(seq);
  }
  if (connector_) connector_->start_step(m.kv_connector, scheduled.seqs.empty());
  ModelRunnerOutput out = runner_->execute(scheduled, states);
  if (connector_) out.kv_connector = connector_->finish_step(m.kv_connector);
  if (proposer_) propose(scheduled, out);
  return out;
}

void Worker::propose(const SchedulerOutput& scheduled, ModelRunnerOutput& out) {
  const SpeculativeConfig& spec = init_.speculative;
  const int64_t batch = static_cast<int64_t>(scheduled.seqs.size());
  if (batch == 0 || (spec.disable_by_batch_size > 0 && batch > spec.disable_by_batch_size)) return;
  // Each scheduled request as the target's KV leaves it after this step: its tokens with the
  // ones just emitted, and the positions computed (less the rejected drafts). A request still in
  // prefill is fed to a draft model too (max_drafts 0), so that it follows chunk by chunk.
  std::vector<std::vector<TokenId>> tokens(scheduled.seqs.size());
  std::vector<ProposalRequest> requests;
  size_t next_sampled = 0;
  for (size_t i = 0; i < scheduled.seqs.size(); ++i) {
    const ScheduledSeq& seq = scheduled.seqs[i];
    const RequestState& r = requests_.at(seq.request_id);
    tokens[i] = r.all_tokens;
    int64_t computed = seq.num_computed_tokens + static_cast<int64_t>(seq.tokens.size());
    while (next_sampled < out.sampled.size() && out.sampled[next_sampled].request_id == seq.request_id) {
      tokens[i].push_back(out.sampled[next_sampled++].token);
    }
    for (const SpecDecodeCounts& c : out.spec) {
      if (c.request_id == seq.request_id) computed += c.num_accepted;
    }
    ProposalRequest p{seq.request_id, tokens[i], computed, 0, r.cache_salt};
    const int64_t num_tokens = static_cast<int64_t>(tokens[i].size());
    if (seq.sample && computed == num_tokens - 1) {
      // Room left: positions up to max_model_len - 1, and no more tokens than max_tokens allows
      // (a step emits the drafts it accepts plus one).
      const int64_t num_output = num_tokens - static_cast<int64_t>(r.num_prompt_tokens);
      p.max_drafts = std::max<int64_t>(0, std::min({spec.num_speculative_tokens, init_.max_model_len - num_tokens,
                                                    r.sampling.params.max_tokens - num_output - 1}));
    }
    requests.push_back(p);
  }
  // Proposals depend on each request alone; a fixed order keeps the draft model's batches, and
  // so its floating-point sums, the same from run to run.
  std::sort(requests.begin(), requests.end(), [](const ProposalRequest& a, const ProposalRequest& b) { return a.id < b.id; });
  std::vector<std::vector<TokenId>> drafts = proposer_->propose(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!drafts[i].empty()) out.drafts.push_back(DraftTokens{requests[i].id, std::move(drafts[i])});
  }
}

}  // namespace pagoda
