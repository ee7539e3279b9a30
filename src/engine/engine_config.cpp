#include "engine/engine_types.h"
#include "loader/model_config.h"

namespace pagoda {

Status EngineConfig::validate(const ModelConfig* model, const ModelConfig* draft) {
  SchedulerConfig& sc = scheduler;
  if (sc.max_model_len < 0) return invalid_argument("--max-model-len must be positive");
  if (model != nullptr) {
    // Beyond the trained context only as far as the checkpoint's rope scaling stretches it.
    const int64_t longest = model->max_context_len();
    if (sc.max_model_len == 0) sc.max_model_len = longest;
    if (sc.max_model_len < 1 || sc.max_model_len > longest) {
      return invalid_argument("--max-model-len must be in [1, " + std::to_string(longest) + "] (the model's context length" +
                              (longest != model->max_position_embeddings ? std::string(", with its rope scaling") : "") +
                              "; --rope-scaling or --hf-overrides can stretch it)");
    }
  }
  if (block_size < 1 || block_size > 256) return invalid_argument("--block-size must be in [1, 256]");
  if (sc.max_num_seqs < 1) return invalid_argument("--max-num-seqs must be at least 1");
  if (sc.max_num_batched_tokens < 1) return invalid_argument("--max-num-batched-tokens must be at least 1");
  if (sc.long_prefill_token_threshold < 0) return invalid_argument("--long-prefill-token-threshold must be >= 0");
  if (!sc.enable_chunked_prefill && sc.max_model_len > 0 && sc.max_num_batched_tokens < sc.max_model_len) {
    return invalid_argument("--max-num-batched-tokens (" + std::to_string(sc.max_num_batched_tokens) +
                            ") is smaller than --max-model-len (" + std::to_string(sc.max_model_len) +
                            "): without chunked prefill a long prompt could never be scheduled; raise "
                            "--max-num-batched-tokens, lower --max-model-len, or enable chunked prefill");
  }
  if (gpu_memory_utilization != 0 && !(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1)) {
    return invalid_argument("--gpu-memory-utilization must be in (0, 1], got " + std::to_string(gpu_memory_utilization));
  }
  if (kv_cache_memory < 0) return invalid_argument("--kv-cache-memory-bytes must be positive");
  if (max_logprobs < 0) return invalid_argument("--max-logprobs must be >= 0");
  return speculative.validate(model, draft, sc.max_model_len);
}

}  // namespace pagoda
