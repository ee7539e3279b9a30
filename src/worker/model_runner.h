// ModelRunner: executes one SchedulerOutput: builds the flat ForwardBatch (tokens, positions,
// slot mapping, block tables), runs the model once over every scheduled token of every request,
// computes logits only for the rows that need them, and samples each request with its own
// parameters and RNG (its SamplingState, which the worker keeps with the rest of the request); a request with speculative drafts gets logits for its last token and every
// draft, and the RejectionSampler verifies them. Owns the model, the KV cache memory (from
// initialize_kv_cache, before the first step) and the samplers.
// Engine thread only: not thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/model.h"
#include "sample/rejection_sampler.h"
#include "sample/sampler.h"
#include "scheduler/scheduler_output.h"

namespace pagoda {

// How one request samples: its parameters, its generator, and the ids masked while fewer than
// params.min_tokens tokens are out.
struct SamplingState {
  SamplingParams params;
  SamplerRng rng;
  std::vector<TokenId> min_tokens_suppressed;
};

class ModelRunner {
 public:
  explicit ModelRunner(std::unique_ptr<Model> model);

  const ModelConfig& config() const { return model_->config(); }
  const Model& model() const { return *model_; }
  const KvCacheTensors& kv_cache() const { return kv_; }
  // Takes the KV cache memory (once, before the first step).
  void initialize_kv_cache(KvCacheTensors kv) { kv_ = std::move(kv); }

  // One forward pass over the scheduled tokens, then sampling; states[i] is scheduled.seqs[i]'s
  // (its generator advances).
  ModelRunnerOutput execute(const SchedulerOutput& scheduled, std::span<SamplingState* const> states);

 private:
  std::unique_ptr<Model> model_;
  KvCacheTensors kv_;
  Sampler sampler_;
  RejectionSampler rejection_sampler_;

  // Persistent input buffers (reused every step; the shape graph capture needs later).
  ForwardBatchBuffers inputs_;
  std::vector<int64_t> logit_rows_;
  std::vector<float> logits_;
};

}  // namespace pagoda
