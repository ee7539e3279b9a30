// make_proposer: the Proposer a worker makes from a validated SpeculativeConfig.
#pragma once

#include <cstdint>
#include <memory>

#include "base/status.h"
#include "model/model.h"
#include "speculative/proposer.h"
#include "speculative/speculative_config.h"
#include "tensor/kv_cache_dtype.h"

namespace pagoda {

// What a worker's proposer works within: the engine's limits.
struct ProposerLimits {
  int64_t max_model_len = 0;
  int64_t max_num_batched_tokens = 0;
  bool enable_prefix_caching = true;
};

// The proposer of a validated config: an NgramProposer, or a DraftModelProposer over `draft`
// with a KV cache of `draft_blocks` blocks of `block_size` tokens in `dtype`. Null when off.
Result<std::unique_ptr<Proposer>> make_proposer(const SpeculativeConfig& config, const ProposerLimits& limits,
                                                std::unique_ptr<Model> draft, int64_t draft_blocks,
                                                int64_t block_size, KvCacheDtype dtype);

}  // namespace pagoda
