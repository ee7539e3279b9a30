// LlamaModel: the Llama family forward pass, which also covers Mistral and TinyLlama (same
// graph), Qwen2/2.5 (Q/K/V biases, often tied embeddings) and Qwen3 (per-head RMSNorm on q and
// k before RoPE). Pre-norm decoder: RMSNorm -> GQA attention with RoPE -> residual -> RMSNorm ->
// SwiGLU MLP -> residual. Single-threaded use (see model/model.h).
#pragma once

#include <memory>

#include "model/model.h"

namespace pagoda {

Result<std::unique_ptr<Model>> create_llama_model(ModelSource source, const Backend& backend);

}  // namespace pagoda
