// DecoderModel: a pre-norm decoder-only transformer assembled from blocks: token embedding, then
// per layer the attention block and the feed-forward block the architecture names
// (model/arch/registry.h), then the final RMSNorm and the LM head (tied to the embedding where
// the config says so). Single-threaded use (see model/model.h).
#pragma once

#include <memory>

#include "model/arch/registry.h"
#include "model/model.h"

namespace pagoda {

Result<std::unique_ptr<Model>> create_decoder_model(ModelSource source, const Backend& backend,
                                                    const ArchitectureSpec& spec);

}  // namespace pagoda
