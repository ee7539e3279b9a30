// Model: a decoder-only transformer's forward pass over a ForwardBatch, computed with a
// backend's kernels on weights from a ModelSource.
//
// Architectures are assembled from the blocks of model/layers (attention, feed-forward) as the
// table in model/arch/registry.h says. A Model keeps its weights
// (and the mappings behind them) alive and owns a scratch workspace, so it is used by one thread
// at a time (the engine thread).
#pragma once

#include <memory>

#include "backend/backend.h"
#include "base/status.h"
#include "loader/model_source.h"
#include "model/forward_batch.h"
#include "model/kv_cache.h"
#include "model/quant/quant_mix.h"
#include "model/tensor_parallel.h"
#include "tensor/tensor.h"

namespace pagoda {

class Model {
 public:
  virtual ~Model() = default;

  // The whole model's config (what the scheduler, the sampler and the logits see).
  virtual const ModelConfig& config() const = 0;
  // The backend's kernels the model computes with (its device: the KV cache is allocated there).
  virtual const Kernels& kernels() const = 0;
  // What this process computes: under tensor parallelism its rank's heads, KV heads and
  // intermediate sizes (model/tensor_parallel.h), which size its KV cache and buffers; else
  // config().
  virtual const ModelConfig& shard_config() const { return config(); }

  // Bytes of weights the model holds in memory (matrices as stored or packed, plus the f32
  // vectors), for sizing the KV cache against --gpu-memory-utilization.
  virtual int64_t weight_bytes() const = 0;

  // Runs every layer on the batch, writing the new tokens' K/V into `kv`. Returns the final
  // normed hidden states [num_tokens, hidden_size] f32, a view into the model's workspace (device
  // memory) that stays valid until the next call. A pipeline stage runs its own layers on what the stage
  // before it sent, and every stage but the last sends its result on and returns no tensor.
  virtual Tensor forward(const ForwardBatch& batch, const KvCacheTensors& kv) = 0;
  // Whether this process computes logits (false on a pipeline stage before the last).
  virtual bool computes_logits() const { return true; }

  // logits[i, :] = LM head applied to hidden row rows[i].  hidden: [num_tokens, hidden_size]
  // f32 from forward() (device memory); rows: host; logits: [num_rows, vocab_size] f32, host
  // memory, caller-owned (the sampler reads them).
  virtual void compute_logits(const Tensor& hidden, const int64_t* rows, int64_t num_rows,
                              float* logits) = 0;
};

// Builds the model for source.config.architecture (an entry of model/arch/registry.h: "llama",
// "qwen2", "qwen3", "qwen3_moe", "qwen2_moe", "mixtral"), taking over the weights, which it
// uploads or packs into the backend's memory. The model keeps the backend's kernels (and so its
// context), so `backend` need not outlive it. Fails naming the source for an unknown architecture, a missing tensor, a shape
// mismatch, or a weight type the backend cannot compute on.
// With tp.size > 1: rank tp.rank's shard, computed together with the other ranks over tp.comm
// (every rank runs every forward pass and compute_logits call with the same batch; each gets the
// whole logits). A communicator failure during a pass throws std::runtime_error.
// With pp.size > 1: the layers of stage pp.stage (model/tensor_parallel.h), run in step with the
// other stages (every stage runs every forward pass with the same batch, in the same order).
// `mix`: the types float weights get at load (--dtype, --quantization w8a8 / q4_k_m: model/quant/
// quant_mix.h); a checkpoint's own quantization comes with it (ModelConfig::quantization).
Result<std::unique_ptr<Model>> create_model(ModelSource source, const Backend& backend, const TensorParallel& tp = {},
                                            const PipelineParallel& pp = {},
                                            std::optional<QuantMix> mix = std::nullopt);

}  // namespace pagoda
