// The architectures Pagoda runs, as a table: each names the model family it covers and how its
// decoder layers are assembled from the blocks of model/layers (the attention block, and the
// feed-forward block each layer uses: the dense gated MLP, or for the mixtures of experts the
// sparse block on the layers the config makes sparse, model/layers/moe.h). The attention variants within a family (Q/K/V biases,
// per-head q/k norms, sliding windows) come from the config, which the config parsers fill per
// architecture. create_model (model/model.h) looks the config's architecture up here.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "model/layers/mlp.h"
#include "model/layers/weight_loader.h"

namespace pagoda {

// Layer `layer`'s feed-forward block, its tensors named <prefix>...
using FeedForwardLoader = Result<std::unique_ptr<FeedForward>> (*)(WeightLoader& weights, const std::string& prefix,
                                                                   const ModelConfig& cfg, int64_t layer);

struct ArchitectureSpec {
  std::string_view name;    // ModelConfig::architecture
  std::string_view models;  // the checkpoints it covers, for messages
  FeedForwardLoader feed_forward;
};

std::span<const ArchitectureSpec> architectures();
const ArchitectureSpec* find_architecture(std::string_view name);  // nullptr when unknown

}  // namespace pagoda
