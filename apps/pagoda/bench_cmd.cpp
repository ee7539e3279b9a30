// In-process benchmarks, like vLLM's: `pagoda bench throughput` (requests/s, output tokens/s,
// total tokens/s over --num-prompts random or file prompts) and `pagoda bench latency` (one batch
// end to end, several times; prefill and decode apart).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/pagoda/bench/prompt_file.h"
#include "apps/pagoda/bench/serve_stats.h"
#include "apps/pagoda/commands.h"
#include "launch/engine_setup.h"
#include "launch/ranks.h"
#include "engine/llm.h"

namespace pagoda::app {

namespace {

// --dataset-name random: input_len random ids. copy: a random passage of ceil(input_len / 2)
// ids, then the passage again up to input_len: a model that copies goes on repeating it.
std::vector<GenerateRequest> random_requests(int64_t count, int64_t input_len, int64_t output_len, int64_t vocab,
                                             uint64_t seed, const std::string& dataset_name, double temperature) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<TokenId> token(0, static_cast<TokenId>(vocab - 1));
  const int64_t passage = dataset_name == "copy" ? (input_len + 1) / 2 : input_len;
  std::vector<GenerateRequest> requests(static_cast<size_t>(count));
  for (auto& r : requests) {
    for (int64_t i = 0; i < passage; ++i) r.prompt_token_ids.push_back(token(rng));
    for (int64_t i = passage; i < input_len; ++i) r.prompt_token_ids.push_back(r.prompt_token_ids[static_cast<size_t>(i - passage)]);
    r.params.max_tokens = output_len;
    r.params.ignore_eos = true;
    r.params.temperature = temperature;
  }
  return requests;
}

// "Spec decoding: D drafts, ..." when the engine verified any drafts.
void print_spec_stats(const SpecDecodeStats& spec, nlohmann::json* j) {
  if (spec.num_drafts == 0) return;
  const double acceptance_rate =
      spec.num_draft_tokens > 0 ? static_cast<double>(spec.num_accepted_tokens) / spec.num_draft_tokens : 0;
  const double acceptance_length = 1.0 + static_cast<double>(spec.num_accepted_tokens) / spec.num_drafts;
  std::printf("Spec decoding: %lld drafts, %lld draft tokens, %lld accepted; acceptance rate %.1f%%, mean "
              "acceptance length %.2f\n",
              static_cast<long long>(spec.num_drafts), static_cast<long long>(spec.num_draft_tokens),
              static_cast<long long>(spec.num_accepted_tokens), 100 * acceptance_rate, acceptance_length);
  (*j)["spec_decode_num_drafts"] = spec.num_drafts;
  (*j)["spec_decode_num_draft_tokens"] = spec.num_draft_tokens;
  (*j)["spec_decode_num_accepted_tokens"] = spec.num_accepted_tokens;
  (*j)["spec_decode_acceptance_rate"] = acceptance_rate;
  (*j)["spec_decode_acceptance_length"] = acceptance_length;
}

// --dataset-path prompts, EOS ignored so that each runs its output_len.
Result<std::vector<GenerateRequest>> file_requests(const BenchThroughputFlags& f) {
  PAGODA_ASSIGN_OR_RETURN(auto prompts, bench::read_prompt_file(f.dataset_path, f.num_prompts, f.output_len));
  std::vector<GenerateRequest> out;
  for (bench::FilePrompt& p : prompts) {
    GenerateRequest r;
    r.prompt = std::move(p.prompt);
    r.params.max_tokens = p.output_len;
    r.params.ignore_eos = true;
    r.params.temperature = f.temperature;
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

int run_bench_throughput(const BenchThroughputFlags& f) {
  if (f.input_len < 1 || f.output_len < 1 || f.num_prompts < 1) {
    return fail(invalid_argument("--input-len, --output-len and --num-prompts must be at least 1"));
  }
  if (Status st = f.engine.check_one_replica("pagoda bench throughput"); !st.ok()) return fail(st);
  auto group = RankGroup::start(f.model, f.engine);  // before any thread; declared before the engine
  if (!group.ok()) return fail(group.status());
  auto setup = make_engine(f.model, f.engine, {}, group->get());
  if (!setup.ok()) return fail(setup.status());
  std::fprintf(stderr, "%s\n%s\n", setup->kernels.c_str(), setup->engine->core().kv_cache_summary().c_str());
  if (const std::string spec = setup->engine->core().speculative_summary(); !spec.empty()) {
    std::fprintf(stderr, "%s\n", spec.c_str());
  }
  std::vector<GenerateRequest> requests;
  if (f.dataset_path.empty()) {
    requests = random_requests(f.num_prompts, f.input_len, f.output_len, setup->engine->core().model_config().vocab_size,
                               f.dataset_seed, f.dataset_name, f.temperature);
  } else {
    auto loaded = file_requests(f);
    if (!loaded.ok()) return fail(loaded.status());
    requests = std::move(*loaded);
  }
  LLM llm(std::move(setup->engine));
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
  nlohmann::json spec_json = nlohmann::json::object();
  print_spec_stats(llm.core().spec_stats(), &spec_json);
  if (!f.output_json.empty()) {
    nlohmann::json j = {{"elapsed_time", elapsed},
                        {"num_requests", results->size()},
                        {"total_num_tokens", prompt_tokens + output_tokens},
                        {"total_output_tokens", output_tokens},
                        {"requests_per_second", n / elapsed},
                        {"tokens_per_second", (prompt_tokens + output_tokens) / elapsed},
                        {"output_tokens_per_second", output_tokens / elapsed},
                        {"max_num_seqs", f.engine.max_num_seqs}};
    j.update(spec_json);
    std::ofstream(f.output_json) << j.dump(2) << "\n";
  }
  return 0;
}

int run_bench_latency(const BenchLatencyFlags& f) {
  if (f.batch_size < 1 || f.input_len < 1 || f.output_len < 1 || f.num_iters < 1 || f.num_iters_warmup < 0) {
    return fail(invalid_argument(
        "--batch-size, --input-len, --output-len and --num-iters must be at least 1, --num-iters-warmup >= 0"));
  }
  if (Status st = f.engine.check_one_replica("pagoda bench latency"); !st.ok()) return fail(st);
  auto group = RankGroup::start(f.model, f.engine);  // before any thread; declared before the engine
  if (!group.ok()) return fail(group.status());
  auto setup = make_engine(f.model, f.engine, {}, group->get());
  if (!setup.ok()) return fail(setup.status());
  std::fprintf(stderr, "%s\n%s\n", setup->kernels.c_str(), setup->engine->core().kv_cache_summary().c_str());
  if (const std::string spec = setup->engine->core().speculative_summary(); !spec.empty()) {
    std::fprintf(stderr, "%s\n", spec.c_str());
  }
  const int64_t vocab = setup->engine->core().model_config().vocab_size;
  LLM llm(std::move(setup->engine));
  // Each iteration gets prompts of its own: repeating one would hit the prefix cache and
  // measure no prefill at all.
  std::vector<double> e2e, prefill, decode;
  for (int64_t it = 0; it < f.num_iters_warmup + f.num_iters; ++it) {
    auto batch = random_requests(f.batch_size, f.input_len, f.output_len, vocab, f.dataset_seed + static_cast<uint64_t>(it),
                                 f.dataset_name, f.temperature);
    const auto start = std::chrono::steady_clock::now();
    auto results = llm.generate(std::move(batch));
    const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!results.ok()) return fail(results.status());
    if (it < f.num_iters_warmup) continue;
    // Prefill: until the batch's last first token; decode: the rest, per output token.
    double first = 0;
    for (const RequestOutput& r : *results) first = std::max(first, r.timings.first_token_s);
    e2e.push_back(elapsed);
    prefill.push_back(first);
    if (f.output_len > 1) decode.push_back((elapsed - first) / static_cast<double>(f.output_len - 1));
    std::fprintf(stderr, "\riteration %lld/%lld: %.3f s", static_cast<long long>(it - f.num_iters_warmup + 1),
                 static_cast<long long>(f.num_iters), elapsed);
  }
  std::fprintf(stderr, "\n");
  const std::vector<double> ps = {10, 25, 50, 75, 90, 99};
  const bench::MetricStats s = bench::metric_stats(e2e, ps);
  const bench::MetricStats p = bench::metric_stats(prefill, {});
  const bench::MetricStats d = bench::metric_stats(decode, {});
  std::printf("Avg latency: %.4f seconds\n", s.mean);
  for (double q : ps) std::printf("%g%% percentile latency: %.4f seconds\n", q, s.percentiles.at(q));
  std::printf("Avg prefill (batch of %lld x %lld tokens): %.4f seconds, %.1f tokens/s\n",
              static_cast<long long>(f.batch_size), static_cast<long long>(f.input_len), p.mean,
              p.mean > 0 ? static_cast<double>(f.batch_size * f.input_len) / p.mean : 0.0);
  if (!decode.empty()) {
    std::printf("Avg decode step: %.4f seconds, %.1f output tokens/s\n", d.mean,
                d.mean > 0 ? static_cast<double>(f.batch_size) / d.mean : 0.0);
  }
  nlohmann::json spec_json = nlohmann::json::object();
  print_spec_stats(llm.core().spec_stats(), &spec_json);
  if (!f.output_json.empty()) {
    nlohmann::json j = {{"avg_latency", s.mean},
                        {"latencies", e2e},
                        {"prefill_latencies", prefill},
                        {"avg_prefill_latency", p.mean},
                        {"avg_decode_step_latency", d.mean},
                        {"batch_size", f.batch_size},
                        {"input_len", f.input_len},
                        {"output_len", f.output_len}};
    nlohmann::json percentiles;
    for (double q : ps) percentiles[std::to_string(static_cast<int>(q))] = s.percentiles.at(q);
    j["percentiles"] = percentiles;
    j.update(spec_json);
    std::ofstream out(f.output_json);
    out << j.dump(2) << "\n";
    if (!out) return fail(Status(StatusCode::kIoError, f.output_json + ": cannot write"));
  }
  return 0;
}

}  // namespace pagoda::app
