#include "speculative/speculative_config.h"

#include "loader/model_config.h"
#include "speculative/draft_model_proposer.h"
#include "speculative/make_proposer.h"
#include "speculative/ngram_proposer.h"

namespace pagoda {

Status SpeculativeConfig::validate(const ModelConfig* target, const ModelConfig* draft, int64_t max_model_len) {
  if (method == "ngram") {
    if (prompt_lookup_min == 0 && prompt_lookup_max == 0) prompt_lookup_min = prompt_lookup_max = 5;
    if (prompt_lookup_min == 0) prompt_lookup_min = prompt_lookup_max;
    if (prompt_lookup_max == 0) prompt_lookup_max = prompt_lookup_min;
    const NgramProposerConfig ngram{num_speculative_tokens, prompt_lookup_min, prompt_lookup_max};
    if (Status st = ngram.validate(); !st.ok()) return invalid_argument("--speculative-config: " + st.message());
  } else if (method == "draft_model") {
    const std::string name = "--speculative-config: draft model " + model;
    if (target != nullptr && draft == nullptr) return invalid_argument(name + ": not loaded");
    if (target != nullptr && draft->vocab_size != target->vocab_size) {
      return invalid_argument(name + " has a vocabulary of " + std::to_string(draft->vocab_size) + " tokens, the model " +
                              std::to_string(target->vocab_size) + ": a draft must share the model's vocabulary");
    }
    if (target != nullptr && draft->max_context_len() < max_model_len) {
      return invalid_argument(name + " has a context of " + std::to_string(draft->max_context_len()) +
                              " tokens, shorter than --max-model-len " + std::to_string(max_model_len) +
                              "; lower --max-model-len or use a draft with a longer context");
    }
    if (num_speculative_tokens < 1 || num_speculative_tokens > NgramProposerConfig::kMaxSpeculativeTokens) {
      return invalid_argument("--speculative-config: num_speculative_tokens must be in [1, " +
                              std::to_string(NgramProposerConfig::kMaxSpeculativeTokens) + "], got " +
                              std::to_string(num_speculative_tokens));
    }
  } else if (!method.empty()) {
    return invalid_argument("--speculative-config: method '" + method +
                            "' is not supported (supported: ngram, draft_model)");
  }
  if (disable_by_batch_size < 0) return invalid_argument("--speculative-config: disable_by_batch_size must be >= 0");
  return Status::ok_status();
}

Result<std::unique_ptr<Proposer>> make_proposer(const SpeculativeConfig& config, const ProposerLimits& limits,
                                                std::unique_ptr<Model> draft, int64_t draft_blocks,
                                                int64_t block_size, KvCacheDtype dtype) {
  if (config.method == "ngram") {
    return std::unique_ptr<Proposer>(std::make_unique<NgramProposer>(
        NgramProposerConfig{config.num_speculative_tokens, config.prompt_lookup_min, config.prompt_lookup_max}));
  }
  if (config.method != "draft_model") return std::unique_ptr<Proposer>();
  if (draft == nullptr) return invalid_argument("--speculative-config: draft model " + config.model + ": not loaded");
  PAGODA_ASSIGN_OR_RETURN(KvCacheTensors kv,
                          KvCacheTensors::allocate(draft->kernels(), draft->config(), draft_blocks, block_size, dtype));
  DraftModelProposerConfig dc{config.model, config.num_speculative_tokens, limits.max_num_batched_tokens,
                              limits.enable_prefix_caching};
  return std::unique_ptr<Proposer>(std::make_unique<DraftModelProposer>(std::move(draft), std::move(kv), dc));
}

}  // namespace pagoda
