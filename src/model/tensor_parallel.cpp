#include "model/tensor_parallel.h"

#include <algorithm>
#include <stdexcept>

namespace pagoda {
namespace {

IndexRange even_share(int64_t n, const TensorParallel& tp) {
  const int64_t per = n / tp.size;
  return IndexRange{tp.rank * per, (tp.rank + 1) * per};
}

// The tensor-parallel part of plan_shard: the heads, intermediate features and vocabulary rows.
Result<ShardPlan> plan_tensor_shard(const ModelConfig& cfg, const TensorParallel& tp, const std::string& source);

}  // namespace

Result<IndexRange> stage_layers(int64_t num_layers, int stage, int stages, const std::vector<int64_t>& partition) {
  std::vector<int64_t> counts = partition;
  if (counts.empty()) {
    counts.assign(static_cast<size_t>(stages), num_layers / stages);
    for (int64_t i = 0; i < num_layers % stages; ++i) ++counts[static_cast<size_t>(stages - 2 - i)];
  }
  std::string text;
  for (int64_t c : counts) text += (text.empty() ? "" : ",") + std::to_string(c);
  if (static_cast<int>(counts.size()) != stages) {
    return invalid_argument("the layer partition " + text + " has " + std::to_string(counts.size()) +
                            " stages, not " + std::to_string(stages));
  }
  int64_t sum = 0;
  for (int64_t c : counts) {
    if (c < 1) return invalid_argument("the layer partition " + text + " leaves a stage without layers");
    sum += c;
  }
  if (sum != num_layers) {
    return invalid_argument("the layer partition " + text + " sums to " + std::to_string(sum) + " layers, not the " +
                            std::to_string(num_layers) + " of the model");
  }
  int64_t begin = 0;
  for (int s = 0; s < stage; ++s) begin += counts[static_cast<size_t>(s)];
  return IndexRange{begin, begin + counts[static_cast<size_t>(stage)]};
}

IndexRange kv_head_range(int64_t num_kv_heads, int rank, int size) {
  if (num_kv_heads >= size) return even_share(num_kv_heads, TensorParallel{rank, size, nullptr});
  // Fewer KV heads than ranks: each is replicated on size / kv_heads ranks in a row, the ones
  // holding the query heads that read it.
  const int64_t head = rank / (size / num_kv_heads);
  return IndexRange{head, head + 1};
}

ShardPlan unsharded(const ModelConfig& cfg) {
  ShardPlan p;
  p.local = cfg;
  p.layers = IndexRange{0, cfg.num_layers};
  p.q_heads = IndexRange{0, cfg.num_heads};
  p.kv_heads = IndexRange{0, cfg.num_kv_heads};
  p.intermediate = IndexRange{0, cfg.intermediate_size};
  p.moe_intermediate = IndexRange{0, cfg.moe_intermediate_size};
  p.shared_intermediate = IndexRange{0, cfg.shared_expert_intermediate_size};
  p.vocab = IndexRange{0, cfg.vocab_size};
  p.vocab_per_rank = cfg.vocab_size;
  return p;
}

Result<ShardPlan> plan_shard(const ModelConfig& cfg, const TensorParallel& tp, const std::string& source,
                             const PipelineParallel& pp) {
  if (pp.size < 1 || pp.stage < 0 || pp.stage >= pp.size) {
    return invalid_argument(source + ": pipeline stage " + std::to_string(pp.stage) + " of " + std::to_string(pp.size));
  }
  if (pp.size > cfg.num_layers) {
    return invalid_argument(source + ": --pipeline-parallel-size " + std::to_string(pp.size) + " is more than the " +
                            std::to_string(cfg.num_layers) + " layers");
  }
  if (pp.size > 1 && (pp.comm == nullptr || pp.sender == nullptr || (pp.stage > 0) != (pp.prev >= 0) ||
                      (pp.stage < pp.size - 1) != (pp.next >= 0))) {
    return invalid_argument(source + ": pipeline stage " + std::to_string(pp.stage) + " of " +
                            std::to_string(pp.size) + " needs a communicator, a sender and its neighbours' ranks");
  }
  PAGODA_ASSIGN_OR_RETURN(ShardPlan p, plan_tensor_shard(cfg, tp, source));
  p.pp = pp;
  Result<IndexRange> layers = stage_layers(cfg.num_layers, pp.stage, pp.size, pp.layer_partition);
  if (!layers.ok()) return invalid_argument(source + ": VLLM_PP_LAYER_PARTITION: " + layers.status().message());
  p.layers = *layers;
  p.local.num_layers = p.layers.size();
  p.local.first_layer = p.layers.begin;
  return p;
}

namespace {

Result<ShardPlan> plan_tensor_shard(const ModelConfig& cfg, const TensorParallel& tp, const std::string& source) {
  const std::string size = std::to_string(tp.size);
  if (tp.size < 1 || tp.rank < 0 || tp.rank >= tp.size) {
    return invalid_argument(source + ": tensor-parallel rank " + std::to_string(tp.rank) + " of " + size);
  }
  if (tp.size > 1 && (tp.comm == nullptr || tp.comm->size() != tp.size || tp.comm->rank() != tp.rank)) {
    return invalid_argument(source + ": tensor parallelism of size " + size +
                            " needs a communicator of that size at this rank");
  }
  auto refuse = [&](const std::string& what, int64_t n) {
    return invalid_argument(source + ": --tensor-parallel-size " + size + " does not divide " + what + " (" +
                            std::to_string(n) + "); choose a size that does");
  };
  ShardPlan p = unsharded(cfg);
  p.tp = tp;
  if (tp.size == 1) return p;
  if (cfg.num_heads % tp.size != 0) return refuse("the attention heads", cfg.num_heads);
  p.q_heads = even_share(cfg.num_heads, tp);
  if (cfg.num_kv_heads >= tp.size) {
    if (cfg.num_kv_heads % tp.size != 0) return refuse("the KV heads", cfg.num_kv_heads);
  } else if (tp.size % cfg.num_kv_heads != 0) {
    return invalid_argument(source + ": --tensor-parallel-size " + size + " is larger than the KV heads (" +
                            std::to_string(cfg.num_kv_heads) + ") and not a multiple of them");
  }
  p.kv_heads = kv_head_range(cfg.num_kv_heads, tp.rank, tp.size);
  if (cfg.intermediate_size % tp.size != 0) return refuse("the MLP's intermediate size", cfg.intermediate_size);
  p.intermediate = even_share(cfg.intermediate_size, tp);
  if (cfg.num_experts > 0) {
    if (cfg.moe_intermediate_size % tp.size != 0) {
      return refuse("the experts' intermediate size", cfg.moe_intermediate_size);
    }
    p.moe_intermediate = even_share(cfg.moe_intermediate_size, tp);
    if (cfg.shared_expert_intermediate_size % tp.size != 0) {
      return refuse("the shared expert's intermediate size", cfg.shared_expert_intermediate_size);
    }
    p.shared_intermediate = even_share(cfg.shared_expert_intermediate_size, tp);
    p.local.moe_intermediate_size = p.moe_intermediate.size();
    p.local.shared_expert_intermediate_size = p.shared_intermediate.size();
  }
  p.vocab_per_rank = (cfg.vocab_size + tp.size - 1) / tp.size;
  p.vocab.begin = std::min(cfg.vocab_size, tp.rank * p.vocab_per_rank);
  p.vocab.end = std::min(cfg.vocab_size, (tp.rank + 1) * p.vocab_per_rank);
  p.local.num_heads = p.q_heads.size();
  p.local.num_kv_heads = p.kv_heads.size();
  p.local.intermediate_size = p.intermediate.size();
  return p;
}

}  // namespace

void all_reduce_or_throw(const Kernels& k, const TensorParallel& tp, float* data, int64_t count) {
  if (tp.size <= 1) return;
  if (Status st = k.all_reduce(*tp.comm, data, count); !st.ok()) {
    throw std::runtime_error("tensor-parallel all-reduce: " + st.message());
  }
}

}  // namespace pagoda
