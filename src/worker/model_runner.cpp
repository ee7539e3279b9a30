#include "worker/model_runner.h"

#include "base/check.h"

namespace pagoda {

ModelRunner::ModelRunner(std::unique_ptr<Model> model) : model_(std::move(model)) {}

ModelRunnerOutput ModelRunner::execute(const SchedulerOutput& scheduled, std::span<SamplingState* const> states) {
  PAGODA_CHECK(states.size() == scheduled.seqs.size());
  ModelRunnerOutput out;
  const int64_t bs = kv_.block_size();
  const int64_t vocab = model_->config().vocab_size;
  inputs_.clear();
  logit_rows_.clear();

  // Which logits rows feed which purpose: sampling rows first, then prompt-logprob rows.
  struct PromptRows {
    const ScheduledSeq* seq;
    const SamplingState* state;
    int64_t first_row, first_index, count;
  };
  std::vector<size_t> sampled_seqs;  // indices into scheduled.seqs
  std::vector<PromptRows> prompt_rows;
  for (size_t k = 0; k < scheduled.seqs.size(); ++k) {
    const ScheduledSeq& seq = scheduled.seqs[k];
    const int64_t num_real = static_cast<int64_t>(seq.tokens.size());
    const int64_t num_drafts = static_cast<int64_t>(seq.draft_tokens.size());
    PAGODA_CHECK(num_drafts == 0 || seq.sample);
    const int64_t n = num_real + num_drafts;
    PAGODA_CHECK(n == 0 || (seq.num_computed_tokens + n - 1) / bs < static_cast<int64_t>(seq.block_table.size()));
    const int64_t start =
        inputs_.add_sequence(seq.tokens, seq.draft_tokens, seq.num_computed_tokens, seq.block_table, bs);
    if (seq.sample) {
      sampled_seqs.push_back(k);
      // The last real row predicts the next token; each draft's row, the one after it.
      for (int64_t j = num_real - 1; j < n; ++j) logit_rows_.push_back(start + j);
    }
    const SamplingState& r = *states[k];
    if (r.params.prompt_logprobs) {
      // Row at position p predicts token p + 1; only prompt tokens are wanted.
      const int64_t prompt_len = static_cast<int64_t>(seq.prompt_tokens.size());
      const int64_t last = std::min(seq.num_computed_tokens + num_real, prompt_len - 1);
      if (last > seq.num_computed_tokens) {
        prompt_rows.push_back({&seq, &r, start, seq.num_computed_tokens + 1, last - seq.num_computed_tokens});
      }
    }
  }
  const int64_t num_sample_rows = static_cast<int64_t>(logit_rows_.size());
  for (const PromptRows& p : prompt_rows) {
    for (int64_t i = 0; i < p.count; ++i) logit_rows_.push_back(p.first_row + i);
  }
  if (inputs_.empty()) return out;

  Tensor hidden = model_->forward(inputs_.batch(), kv_);
  if (!model_->computes_logits()) return out;  // a pipeline stage before the last
  logits_.resize(logit_rows_.size() * static_cast<size_t>(vocab));
  if (!logit_rows_.empty()) {
    model_->compute_logits(hidden, logit_rows_.data(), static_cast<int64_t>(logit_rows_.size()), logits_.data());
  }

  // Prompt logprobs first: sampling modifies its rows in place, these rows are separate anyway.
  int64_t row = num_sample_rows;
  for (const PromptRows& p : prompt_rows) {
    const SamplingState& r = *p.state;
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

  // Each sampling request in turn (a row reads only its own logits, parameters and generator, so
  // the order does not change any result): one row sampled, or 1 + k rows verified.
  std::vector<SamplingRow> rows;
  std::vector<TokenId> history;  // output tokens, then drafts: position j's penalties see j drafts
  float* logits = logits_.data();
  for (size_t k : sampled_seqs) {
    const ScheduledSeq* seq = &scheduled.seqs[k];
    SamplingState& r = *states[k];
    const size_t num_drafts = seq->draft_tokens.size();
    verification_rows(r.params, &r.rng, seq->prompt_tokens, seq->output_tokens, seq->draft_tokens,
                      r.min_tokens_suppressed, &history, &rows, seq->allowed_tokens);
    std::vector<SampledToken> emitted;
    if (num_drafts == 0) {
      emitted = sampler_.sample(logits, vocab, rows);
    } else {
      VerifiedTokens v = rejection_sampler_.verify(logits, vocab, rows, seq->draft_tokens);
      out.spec.push_back({seq->request_id, static_cast<int64_t>(num_drafts), v.num_accepted});
      emitted = std::move(v.tokens);
    }
    logits += static_cast<int64_t>(num_drafts + 1) * vocab;
    for (const SampledToken& t : emitted) {
      SampledOutput s{seq->request_id, t.token, t.logprob, {}};
      for (const TokenLogprob& e : t.top) s.top_logprobs.push_back({e.token, e.logprob});
      out.sampled.push_back(std::move(s));
    }
  }
  return out;
}

}  // namespace pagoda
