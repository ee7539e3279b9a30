#include "runner/model_runner.h"

#include "base/check.h"

namespace pagoda {

ModelRunner::ModelRunner(std::unique_ptr<Model> model, KvCacheTensors kv)
    : model_(std::move(model)), kv_(std::move(kv)) {}

void ModelRunner::add_request(RequestId id, const SamplingParams& params, uint64_t seed,
                              std::vector<TokenId> min_tokens_suppressed) {
  requests_[id] = PerRequest{params, SamplerRng(seed), std::move(min_tokens_suppressed)};
}

void ModelRunner::remove_request(RequestId id) { requests_.erase(id); }

ModelRunnerOutput ModelRunner::execute(const SchedulerOutput& scheduled) {
  ModelRunnerOutput out;
  const int64_t bs = kv_.block_size();
  const int64_t vocab = model_->config().vocab_size;
  token_ids_.clear();
  positions_.clear();
  slot_mapping_.clear();
  attn_seqs_.clear();
  logit_rows_.clear();

  // Which logits rows feed which purpose: sampling rows first, then prompt-logprob rows.
  struct PromptRows {
    const ScheduledSeq* seq;
    int64_t first_row, first_index, count;
  };
  std::vector<const ScheduledSeq*> sampled_seqs;
  std::vector<PromptRows> prompt_rows;
  for (const ScheduledSeq& seq : scheduled.seqs) {
    const int64_t start = static_cast<int64_t>(token_ids_.size());
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    for (int64_t j = 0; j < n; ++j) {
      const int64_t pos = seq.num_computed_tokens + j;
      PAGODA_CHECK(pos / bs < static_cast<int64_t>(seq.block_table.size()));
      token_ids_.push_back(seq.tokens[static_cast<size_t>(j)]);
      positions_.push_back(static_cast<int32_t>(pos));
      slot_mapping_.push_back(static_cast<int64_t>(seq.block_table[static_cast<size_t>(pos / bs)]) * bs + pos % bs);
    }
    attn_seqs_.push_back(AttentionSeq{start, n, seq.num_computed_tokens + n, seq.block_table.data()});
    if (seq.sample) {
      sampled_seqs.push_back(&seq);
      logit_rows_.push_back(start + n - 1);  // the last row predicts the next token
    }
    const PerRequest& r = requests_.at(seq.request_id);
    if (r.params.prompt_logprobs) {
      // Row at position p predicts token p + 1; only prompt tokens are wanted.
      const int64_t prompt_len = static_cast<int64_t>(seq.prompt_tokens.size());
      const int64_t last = std::min(seq.num_computed_tokens + n, prompt_len - 1);
      if (last > seq.num_computed_tokens) {
        prompt_rows.push_back({&seq, start, seq.num_computed_tokens + 1, last - seq.num_computed_tokens});
      }
    }
  }
  const int64_t num_sample_rows = static_cast<int64_t>(logit_rows_.size());
  for (const PromptRows& p : prompt_rows) {
    for (int64_t i = 0; i < p.count; ++i) logit_rows_.push_back(p.first_row + i);
  }
  if (token_ids_.empty()) return out;

  ForwardBatch batch{token_ids_, positions_, slot_mapping_, attn_seqs_};
  Tensor hidden = model_->forward(batch, kv_);
  logits_.resize(logit_rows_.size() * static_cast<size_t>(vocab));
  if (!logit_rows_.empty()) {
    model_->compute_logits(hidden, logit_rows_.data(), static_cast<int64_t>(logit_rows_.size()), logits_.data());
  }

  // Prompt logprobs first: sampling modifies its rows in place, these rows are separate anyway.
  int64_t row = num_sample_rows;
  for (const PromptRows& p : prompt_rows) {
    const PerRequest& r = requests_.at(p.seq->request_id);
    PromptLogprobsOutput plp{p.seq->request_id, p.first_index, {}};
    for (int64_t i = 0; i < p.count; ++i, ++row) {
      const TokenId token = p.seq->prompt_tokens[static_cast<size_t>(p.first_index + i)];
      SampledToken lp = compute_logprobs(logits_.data() + row * vocab, vocab, token, *r.params.prompt_logprobs);
      SampledOutput e{p.seq->request_id, token, lp.logprob, {}};
      for (const TokenLogprob& t : lp.top) e.top_logprobs.push_back({t.token, t.logprob});
      plp.entries.push_back(std::move(e));
    }
    out.prompt_logprobs.push_back(std::move(plp));
  }

  std::vector<SamplingRow> rows;
  for (const ScheduledSeq* seq : sampled_seqs) {
    PerRequest& r = requests_.at(seq->request_id);
    const bool before_min = static_cast<int64_t>(seq->output_tokens.size()) < r.params.min_tokens;
    rows.push_back(SamplingRow{&r.params, &r.rng, seq->prompt_tokens, seq->output_tokens,
                               before_min ? std::span<const TokenId>(r.min_tokens_suppressed)
                                          : std::span<const TokenId>()});
  }
  std::vector<SampledToken> sampled = sampler_.sample(logits_.data(), vocab, rows);
  for (size_t i = 0; i < sampled.size(); ++i) {
    SampledOutput s{sampled_seqs[i]->request_id, sampled[i].token, sampled[i].logprob, {}};
    for (const TokenLogprob& t : sampled[i].top) s.top_logprobs.push_back({t.token, t.logprob});
    out.sampled.push_back(std::move(s));
  }
  return out;
}

}  // namespace pagoda
