// Tensor parallelism (--tensor-parallel-size N): which shard of a model one rank holds, as vLLM's
// column- and row-parallel layers split it.
//  - Column-parallel (output features split): q, k, v (whole heads, with their biases), gate and
//    up (the intermediate features), each expert's gate and up.
//  - Row-parallel (input features split to match): o and down; each rank's product is a partial
//    sum, added up by one all-reduce per block.
//  - KV heads split across the ranks; where there are fewer KV heads than ranks, each KV head is
//    replicated on the ranks whose query heads read it.
//  - Vocabulary-parallel embedding and LM head: rank r holds vocabulary rows
//    [r * vocab_per_rank, (r + 1) * vocab_per_rank) (the last rank fewer); the embedding is a
//    masked lookup summed by an all-reduce, the logits are all-gathered.
//  - Everything else (norms, the residual stream, a mixture's router) is replicated.
// Heads, KV heads and intermediate sizes must divide evenly; plan_shard refuses a model that
// does not, and WeightLoader refuses a quantized weight whose blocks or groups would straddle two
// ranks.
#pragma once

#include <cstdint>
#include <string>

#include "backend/communicator.h"
#include "base/status.h"
#include "loader/model_config.h"

namespace pagoda {

struct TensorParallel {
  int rank = 0;
  int size = 1;
  // size > 1: the group of the model's ranks, which every forward pass all-reduces and
  // all-gathers over (the model does not own it).
  Communicator* comm = nullptr;
};

// [begin, end) of one dimension.
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

struct ShardPlan {
  TensorParallel tp;
  IndexRange q_heads, kv_heads;   // this rank's query and KV heads
  IndexRange intermediate;        // of the dense MLP's intermediate features
  IndexRange moe_intermediate;    // of each expert's
  IndexRange shared_intermediate; // of a mixture's shared expert
  IndexRange vocab;               // of token_embd / output rows
  int64_t vocab_per_rank = 0;     // ceil(vocab / size): each rank's share of the gathered logits
  // The model as this rank computes it: its heads, KV heads and intermediate sizes (everything
  // else as the whole model's). The KV cache and the forward pass's buffers are sized from it.
  ModelConfig local;

  bool sharded() const { return tp.size > 1; }
};

// The whole model on one rank (no communicator): every range whole, local = cfg.
ShardPlan unsharded(const ModelConfig& cfg);

// The plan of rank tp.rank of tp.size for `cfg`. Fails naming `source` and the reason when the
// heads, the KV heads (or the ranks per KV head) or an intermediate size do not divide evenly, or
// when size > 1 without a communicator of that size.
Result<ShardPlan> plan_shard(const ModelConfig& cfg, const TensorParallel& tp, const std::string& source);

// tp.comm->all_reduce_sum(data, count) when tp.size > 1; throws std::runtime_error with the
// communicator's error (a rank died or stopped answering: the forward pass cannot finish, and
// the step fails, see EngineCore::step).
void all_reduce_or_throw(const TensorParallel& tp, float* data, int64_t count);

}  // namespace pagoda
