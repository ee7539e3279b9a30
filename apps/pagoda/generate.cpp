#include "apps/pagoda/generate.h"

#include <algorithm>
#include <chrono>
#include <numeric>

namespace pagoda::app {

Result<GenerateStats> generate(LoadedModel& loaded, const std::vector<TokenId>& prompt,
                               const GenerateOptions& options,
                               const std::function<void(TokenId)>& on_token) {
  Model& model = *loaded.model;
  const ModelConfig& cfg = model.config();
  PAGODA_RETURN_IF_ERROR(options.sampling.validate());
  if (prompt.empty()) return invalid_argument("the prompt is empty (and the model adds no BOS)");
  if (options.max_tokens < 0) return invalid_argument("max_tokens must be >= 0");
  for (TokenId id : prompt) {
    if (id < 0 || id >= cfg.vocab_size) {
      return invalid_argument("prompt token id " + std::to_string(id) + " is outside the vocabulary");
    }
  }
  const int64_t total = static_cast<int64_t>(prompt.size()) + options.max_tokens;
  if (total > cfg.max_position_embeddings) {
    return invalid_argument("prompt (" + std::to_string(prompt.size()) + " tokens) + max_tokens (" +
                            std::to_string(options.max_tokens) + ") exceeds the model's context length of " +
                            std::to_string(cfg.max_position_embeddings) + " tokens");
  }

  // One sequence: its blocks are simply 0..n-1.
  const int64_t bs = options.block_size;
  const int64_t num_blocks = std::max<int64_t>(1, (total + bs - 1) / bs);
  PAGODA_ASSIGN_OR_RETURN(KvCacheTensors kv, KvCacheTensors::allocate(cfg, num_blocks, bs));
  std::vector<BlockId> block_table(static_cast<size_t>(num_blocks));
  std::iota(block_table.begin(), block_table.end(), 0);

  SamplerRng rng(options.seed ? *options.seed : std::random_device{}());
  const std::vector<TokenId> stop_ids = loaded.tokenizer->stop_ids();
  std::vector<float> logits(static_cast<size_t>(cfg.vocab_size));
  std::vector<TokenId> tokens = prompt;
  std::vector<int32_t> positions;
  std::vector<int64_t> slots;
  GenerateStats stats;
  stats.prompt_tokens = static_cast<int64_t>(prompt.size());

  int64_t computed = 0;  // tokens whose K/V are in the cache
  auto clock_start = std::chrono::steady_clock::now();
  while (stats.generated_tokens < options.max_tokens) {
    const int64_t n = static_cast<int64_t>(tokens.size()) - computed;
    positions.resize(static_cast<size_t>(n));
    slots.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      positions[i] = static_cast<int32_t>(computed + i);
      slots[i] = computed + i;  // block i/bs is block_table[i/bs] == i/bs
    }
    AttentionSeq seq{0, n, computed + n, block_table.data()};
    ForwardBatch batch{std::span<const TokenId>(tokens).subspan(static_cast<size_t>(computed)),
                       positions, slots, std::span<const AttentionSeq>(&seq, 1)};
    Tensor hidden = model.forward(batch, kv);
    int64_t last_row = n - 1;
    model.compute_logits(hidden, &last_row, 1, logits.data());
    computed += n;

    TokenId next = sample_token(logits.data(), cfg.vocab_size, options.sampling, rng);
    if (stats.generated_tokens == 0) {
      auto now = std::chrono::steady_clock::now();
      stats.prefill_seconds = std::chrono::duration<double>(now - clock_start).count();
      clock_start = now;
    }
    tokens.push_back(next);
    ++stats.generated_tokens;
    on_token(next);
    if (!options.ignore_eos && std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) {
      break;
    }
  }
  if (stats.generated_tokens > 0) {
    stats.decode_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - clock_start).count();
  }
  return stats;
}

}  // namespace pagoda::app
