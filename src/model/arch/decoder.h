// DecoderModel: a pre-norm decoder-only transformer assembled from blocks: token embedding, then
// per layer the attention block and the feed-forward block the architecture names
// (model/arch/registry.h), then the final RMSNorm and the LM head (tied to the embedding where
// the config says so). Under tensor parallelism, one rank's shard of it (model/tensor_parallel.h).
// Single-threaded use (see model/model.h).
#pragma once

#include <memory>

#include "model/arch/registry.h"
#include "model/model.h"
#include "model/tensor_parallel.h"

namespace pagoda {

Result<std::unique_ptr<Model>> create_decoder_model(ModelSource source, const Backend& backend,
                                                    const ArchitectureSpec& spec, const TensorParallel& tp = {},
                                                    const PipelineParallel& pp = {},
                                                    std::optional<QuantMix> mix = std::nullopt);

}  // namespace pagoda
