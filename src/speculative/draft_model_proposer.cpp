#include "speculative/draft_model_proposer.h"

#include <algorithm>

#include "base/check.h"

namespace pagoda {

DraftModelProposer::DraftModelProposer(std::unique_ptr<Model> model, KvCacheTensors kv,
                                       DraftModelProposerConfig config)
    : model_(std::move(model)),
      kv_(std::move(kv)),
      blocks_(KvCacheConfig{static_cast<int32_t>(kv_.num_blocks()), static_cast<int32_t>(kv_.block_size()),
                            config.enable_prefix_caching}),
      config_(std::move(config)) {
  PAGODA_CHECK(config_.num_speculative_tokens >= 1 && config_.max_num_batched_tokens >= 1);
}

std::string DraftModelProposer::describe() const {
  const ModelConfig& c = model_->config();
  return "draft model " + config_.name + " (" + std::to_string(c.num_layers) + " layers, hidden " +
         std::to_string(c.hidden_size) + "), up to " + std::to_string(config_.num_speculative_tokens) +
         " draft tokens per step, its own KV cache of " + std::to_string(kv_.num_blocks()) + " blocks";
}

int64_t DraftModelProposer::num_computed_tokens(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() ? -1 : it->second.num_computed;
}

void DraftModelProposer::forget(RequestId id) {
  if (requests_.erase(id)) blocks_.free(id);
}

namespace {

// Appends request `id`'s `tokens` at positions first_pos.. to `inputs` (its blocks cover them).
void add_tokens(ForwardBatchBuffers& inputs, const KvCacheManager& blocks, int64_t block_size, RequestId id,
                std::span<const TokenId> tokens, int64_t first_pos) {
  const std::span<const BlockId> table = blocks.block_table(id);
  PAGODA_CHECK((first_pos + static_cast<int64_t>(tokens.size()) - 1) / block_size < static_cast<int64_t>(table.size()));
  inputs.add_sequence(tokens, {}, first_pos, table, block_size);
}

}  // namespace

void DraftModelProposer::run_pass(const std::vector<Row>& rows, std::vector<TokenId>* next) {
  next->clear();
  if (inputs_.empty()) return;
  Tensor hidden = model_->forward(inputs_.batch(), kv_);
  const int64_t vocab = model_->config().vocab_size;
  if (logit_rows_.empty()) return;
  PAGODA_CHECK(logit_rows_.size() == rows.size());
  logits_.resize(logit_rows_.size() * static_cast<size_t>(vocab));
  model_->compute_logits(hidden, logit_rows_.data(), static_cast<int64_t>(logit_rows_.size()), logits_.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    const float* row = logits_.data() + static_cast<int64_t>(i) * vocab;
    next->push_back(static_cast<TokenId>(std::max_element(row, row + vocab) - row));
  }
}

std::vector<std::vector<TokenId>> DraftModelProposer::propose(std::span<const ProposalRequest> requests) {
  std::vector<std::vector<TokenId>> drafts(requests.size());
  const int64_t bs = kv_.block_size();
  inputs_.clear();
  logit_rows_.clear();

  // Pass 1: every request's tokens the draft has not computed yet, up to what the target has
  // computed (a decoding request: through its last token, whose row gives the first draft).
  std::vector<Row> rows;
  int64_t budget = config_.max_num_batched_tokens;
  for (size_t i = 0; i < requests.size(); ++i) {
    const ProposalRequest& req = requests[i];
    const int64_t len = static_cast<int64_t>(req.tokens.size());
    if (len == 0) continue;
    PerRequest& s = requests_[req.id];
    // Drafts fed last time hold valid K/V where the target accepted them.
    size_t kept = 0;
    while (kept < s.fed.size() && s.num_computed + static_cast<int64_t>(kept) < len &&
           s.fed[kept] == req.tokens[static_cast<size_t>(s.num_computed) + kept]) {
      ++kept;
    }
    s.num_computed += static_cast<int64_t>(kept);
    s.fed.clear();

    const bool decoding = req.max_drafts > 0 && req.num_computed_tokens >= len - 1;
    int64_t end = decoding ? len : std::min(req.num_computed_tokens, len);
    if (decoding) s.num_computed = std::min(s.num_computed, len - 1);  // the last row gives the logits
    if (s.num_computed >= end || budget <= 0) continue;
    ComputedBlocks hit;
    if (!s.has_blocks) {
      hit = blocks_.get_computed_blocks(req.id, req.tokens.first(static_cast<size_t>(end)), req.cache_salt);
      s.num_computed = hit.num_tokens;
    }
    bool drafting = decoding;
    if (end - s.num_computed > budget) {  // catch up part of the way; no drafts this step
      end = s.num_computed + budget;
      drafting = false;
    }
    const int64_t want = drafting ? std::min(req.max_drafts, config_.num_speculative_tokens) : 0;
    const int64_t lookahead = std::max<int64_t>(0, want - 1);
    if (!blocks_.allocate_slots(req.id, req.tokens, s.num_computed, end - s.num_computed + lookahead, hit,
                                req.cache_salt)) {
      if (!s.has_blocks) {  // never admitted: drop the hashes get_computed_blocks kept
        blocks_.free(req.id);
        s.num_computed = 0;
      }
      continue;
    }
    s.has_blocks = true;
    add_tokens(inputs_, blocks_, bs, req.id,
               req.tokens.subspan(static_cast<size_t>(s.num_computed), static_cast<size_t>(end - s.num_computed)),
               s.num_computed);
    budget -= end - s.num_computed;
    s.num_computed = end;
    if (want > 0) {
      logit_rows_.push_back(static_cast<int64_t>(inputs_.token_ids.size()) - 1);
      rows.push_back(Row{i, req.id, want});
    }
  }
  std::vector<TokenId> next;
  run_pass(rows, &next);
  for (size_t r = 0; r < rows.size(); ++r) drafts[rows[r].index].push_back(next[r]);

  // Passes 2..k: each request still wanting drafts feeds its latest one.
  for (int64_t j = 1; j < config_.num_speculative_tokens; ++j) {
    inputs_.clear();
    logit_rows_.clear();
    std::vector<Row> still;
    for (const Row& row : rows) {
      if (row.want <= j) continue;
      const TokenId last = drafts[row.index].back();
      PerRequest& s = requests_.at(row.id);
      add_tokens(inputs_, blocks_, bs, row.id, std::span<const TokenId>(&last, 1),
                 s.num_computed + static_cast<int64_t>(s.fed.size()));
      s.fed.push_back(last);
      logit_rows_.push_back(static_cast<int64_t>(inputs_.token_ids.size()) - 1);
      still.push_back(row);
    }
    if (still.empty()) break;
    run_pass(still, &next);
    for (size_t r = 0; r < still.size(); ++r) drafts[still[r].index].push_back(next[r]);
    rows = std::move(still);
  }
  return drafts;
}

}  // namespace pagoda
