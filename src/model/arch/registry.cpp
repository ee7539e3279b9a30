#include "model/arch/registry.h"

#include "model/layers/moe.h"

namespace pagoda {
namespace {

Result<std::unique_ptr<FeedForward>> dense(WeightLoader& w, const std::string& p, const ModelConfig& cfg, int64_t) {
  return GatedMlp::load(w, p, cfg);
}

// The config says which layers are sparse (decoder_sparse_step, mlp_only_layers).
Result<std::unique_ptr<FeedForward>> sparse_or_dense(WeightLoader& w, const std::string& p, const ModelConfig& cfg,
                                                     int64_t layer) {
  return cfg.is_sparse_layer(layer) ? SparseMoe::load(w, p, cfg) : GatedMlp::load(w, p, cfg);
}

constexpr ArchitectureSpec kArchitectures[] = {
    {"llama", "Llama 2/3, TinyLlama, Mistral", dense},
    {"qwen2", "Qwen2, Qwen2.5 (Q/K/V biases)", dense},
    {"qwen3", "Qwen3 (per-head q/k norms)", dense},
    {"qwen3_moe", "Qwen3-MoE (q/k norms, top-k experts)", sparse_or_dense},
    {"qwen2_moe", "Qwen1.5-MoE, Qwen2-MoE (Q/K/V biases, top-k experts and a shared expert)", sparse_or_dense},
    {"mixtral", "Mixtral (top-2 of 8 experts)", sparse_or_dense},
};

}  // namespace

std::span<const ArchitectureSpec> architectures() { return kArchitectures; }

const ArchitectureSpec* find_architecture(std::string_view name) {
  for (const ArchitectureSpec& a : kArchitectures) {
    if (a.name == name) return &a;
  }
  return nullptr;
}

}  // namespace pagoda
