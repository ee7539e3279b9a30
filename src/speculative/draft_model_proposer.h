// DraftModelProposer: speculative decoding with a second, smaller model of the same vocabulary
// (vLLM's draft-model method). Each call runs the draft greedily for every decoding request at
// once: one batched pass that brings the draft's KV cache up to the request's last token and
// yields the first draft, then one batched pass of one token per request for each further draft.
//
// The draft keeps its own paged KV cache (its own blocks, block table and prefix cache, same
// block size as the target's) and, per request, how far it holds valid K/V:
//   - it feeds exactly the tokens the target has computed, so it follows chunked prefill chunk by
//     chunk (a request still in prefill gets no drafts), and it catches up in one pass (capped at
//     max_num_batched_tokens) after steps that ran without speculation;
//   - drafts it fed itself stay valid where the target accepted them: the next call compares them
//     with the request's tokens and keeps the matching run, so rejected positions are simply
//     recomputed;
//   - forget() (the target finished, aborted or preempted the request) frees its blocks; they stay
//     in the draft's prefix cache, so a resumed or repeated prompt hits there as it does in the
//     target's;
//   - when its cache has no room for a request, that request gets no drafts this step (never an
//     error: drafts are only proposals).
// Engine thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kv/kv_cache_manager.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "speculative/proposer.h"

namespace pagoda {

struct DraftModelProposerConfig {
  std::string name;                     // the draft model's path, for describe()
  int64_t num_speculative_tokens = 0;   // k >= 1
  int64_t max_num_batched_tokens = 0;   // most tokens of one catch-up pass, >= 1
  bool enable_prefix_caching = true;
};

class DraftModelProposer : public Proposer {
 public:
  // Takes over the draft model and its KV cache memory (all of kv's blocks).
  DraftModelProposer(std::unique_ptr<Model> model, KvCacheTensors kv, DraftModelProposerConfig config);

  std::vector<std::vector<TokenId>> propose(std::span<const ProposalRequest> requests) override;
  void forget(RequestId id) override;
  std::string describe() const override;

  // Tokens of request `id` whose K/V the draft holds (-1 for a request it does not know).
  int64_t num_computed_tokens(RequestId id) const;
  const KvCacheManager& kv_manager() const { return blocks_; }
  const KvCacheTensors& kv_cache() const { return kv_; }
  const ModelConfig& model_config() const { return model_->config(); }

 private:
  struct PerRequest {
    int64_t num_computed = 0;      // tokens[0, num_computed) are in the draft's KV cache
    std::vector<TokenId> fed;      // drafts fed at positions num_computed.. (valid if accepted)
    bool has_blocks = false;       // admitted to blocks_
  };
  // One request's rows in a pass.
  struct Row {
    size_t index;                  // into the propose() arguments
    RequestId id;
    int64_t want;                  // drafts wanted
  };
  // Runs the pass built in the buffers; writes the argmax of the last row of each sequence in
  // `rows` to next[i].
  void run_pass(const std::vector<Row>& rows, std::vector<TokenId>* next);

  std::unique_ptr<Model> model_;
  KvCacheTensors kv_;
  KvCacheManager blocks_;
  DraftModelProposerConfig config_;
  std::unordered_map<RequestId, PerRequest> requests_;

  ForwardBatchBuffers inputs_;
  std::vector<int64_t> logit_rows_;
  std::vector<float> logits_;
};

}  // namespace pagoda
