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
#include <vector>

#include "backend/kernels.h"
#include "base/status.h"
#include "comm/communicator.h"
#include "loader/model_config.h"

namespace pagoda {

struct TensorParallel {
  int rank = 0;
  int size = 1;
  // size > 1: the group of the model's ranks, which every forward pass all-reduces and
  // all-gathers over (the model does not own it).
  Communicator* comm = nullptr;
};

class SendQueue;

// Pipeline parallelism (--pipeline-parallel-size P): the layers split into P stages of
// consecutive layers (vLLM's split, stage_layers); stage 0 looks up the embedding, the last
// stage applies the final norm and computes the logits, and each stage sends the residual stream
// [tokens, hidden] f32 on to the next. With tensor parallelism too, each stage is a
// tensor-parallel group of its own, and rank t of a stage talks to rank t of the next.
struct PipelineParallel {
  int stage = 0;
  int size = 1;
  // size > 1: the group over all stages, which the activations go through (the model does not
  // own it); `prev` / `next`: the ranks this stage receives from and sends to (-1 at the ends);
  // `sender`: sends without waiting for the next stage (backend/send_queue.h).
  Communicator* comm = nullptr;
  int prev = -1;
  int next = -1;
  SendQueue* sender = nullptr;
  // The layers of each stage, as vLLM's VLLM_PP_LAYER_PARTITION gives them; empty: the default
  // split (stage_layers).
  std::vector<int64_t> layer_partition = {};
};

// [begin, end) of one dimension.
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// The layers of pipeline stage `stage` of `stages` over `num_layers` (stages <= num_layers):
// `partition` (each stage's layer count) when given, else vLLM's split (get_pp_indices):
// num_layers / stages each, and the remainder one more each for the stages before the last,
// from the second-to-last towards the first (the last stage also computes the final norm and
// the LM head). A partition of another length or sum, or with an empty stage, is refused.
Result<IndexRange> stage_layers(int64_t num_layers, int stage, int stages, const std::vector<int64_t>& partition = {});

struct ShardPlan {
  TensorParallel tp;
  PipelineParallel pp;
  IndexRange layers;              // this stage's layers (all of them without a pipeline)
  IndexRange q_heads, kv_heads;   // this rank's query and KV heads
  IndexRange intermediate;        // of the dense MLP's intermediate features
  IndexRange moe_intermediate;    // of each expert's
  IndexRange shared_intermediate; // of a mixture's shared expert
  IndexRange vocab;               // of token_embd / output rows
  int64_t vocab_per_rank = 0;     // ceil(vocab / size): each rank's share of the gathered logits
  // The model as this rank computes it: its layers, heads, KV heads and intermediate sizes
  // (everything else as the whole model's). The KV cache and the forward pass's buffers are
  // sized from it.
  ModelConfig local;

  bool sharded() const { return tp.size > 1; }
  bool first_stage() const { return pp.stage == 0; }
  bool last_stage() const { return pp.stage == pp.size - 1; }
};

// The KV heads rank `rank` of `size` holds (ShardPlan::kv_heads; the split plan_shard checks):
// an even share, or with fewer heads than ranks the one head it shares with size / heads ranks.
IndexRange kv_head_range(int64_t num_kv_heads, int rank, int size);

// The whole model on one rank (no communicator): every range whole, local = cfg.
ShardPlan unsharded(const ModelConfig& cfg);

// The plan of rank tp.rank of tp.size in pipeline stage pp.stage for `cfg`. Fails naming `source`
// and the reason when the heads, the KV heads (or the ranks per KV head) or an intermediate size
// do not divide evenly, when there are more stages than layers, or when a size > 1 comes without
// a communicator of that size (or, for a pipeline, without its sender).
Result<ShardPlan> plan_shard(const ModelConfig& cfg, const TensorParallel& tp, const std::string& source,
                             const PipelineParallel& pp = {});

// The ranks' sum of `data` (device memory) over tp.comm, through the backend (k.all_reduce), when
// tp.size > 1; throws std::runtime_error with the communicator's error (a rank died or stopped
// answering: the forward pass cannot finish, and the step fails, see EngineCore::step).
void all_reduce_or_throw(const Kernels& k, const TensorParallel& tp, float* data, int64_t count);

}  // namespace pagoda
