// `pagoda bench throughput`: offline throughput on random prompts, like vLLM's
// `vllm bench throughput` (requests/s, output tokens/s, total tokens/s).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/pagoda/commands.h"
#include "apps/pagoda/engine_setup.h"
#include "engine/llm.h"

namespace pagoda::app {

int run_bench_throughput(const BenchThroughputFlags& f) {
  if (f.input_len < 1 || f.output_len < 1 || f.num_prompts < 1) {
    return fail(invalid_argument("--input-len, --output-len and --num-prompts must be at least 1"));
  }
  auto setup = make_engine(f.model, f.engine);
  if (!setup.ok()) return fail(setup.status());
  std::fprintf(stderr, "%s\n", setup->core->kv_cache_summary().c_str());
  const int64_t vocab = setup->core->model_config().vocab_size;
  std::mt19937_64 rng(f.dataset_seed);
  std::uniform_int_distribution<TokenId> token(0, static_cast<TokenId>(vocab - 1));
  std::vector<GenerateRequest> requests(static_cast<size_t>(f.num_prompts));
  for (auto& r : requests) {
    for (int64_t i = 0; i < f.input_len; ++i) r.prompt_token_ids.push_back(token(rng));
    r.params.max_tokens = f.output_len;
    r.params.ignore_eos = true;
    r.params.temperature = 1.0;
  }
  LLM llm(std::move(setup->core));
  const auto start = std::chrono::steady_clock::now();
  auto results = llm.generate(std::move(requests));
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!results.ok()) return fail(results.status());
  int64_t prompt_tokens = 0, output_tokens = 0;
  for (const auto& r : *results) {
    prompt_tokens += r.prompt_tokens;
    output_tokens += r.completion_tokens;
  }
  const double n = static_cast<double>(results->size());
  std::printf("Throughput: %.2f requests/s, %.2f total tokens/s, %.2f output tokens/s\n", n / elapsed,
              (prompt_tokens + output_tokens) / elapsed, output_tokens / elapsed);
  std::printf("Total num prompt tokens:  %lld\nTotal num output tokens:  %lld\nElapsed: %.2f s\n",
              static_cast<long long>(prompt_tokens), static_cast<long long>(output_tokens), elapsed);
  if (!f.output_json.empty()) {
    nlohmann::json j = {{"elapsed_time", elapsed},
                        {"num_requests", results->size()},
                        {"total_num_tokens", prompt_tokens + output_tokens},
                        {"requests_per_second", n / elapsed},
                        {"tokens_per_second", (prompt_tokens + output_tokens) / elapsed},
                        {"output_tokens_per_second", output_tokens / elapsed},
                        {"max_num_seqs", f.engine.max_num_seqs}};
    std::ofstream(f.output_json) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace pagoda::app
