// `pagoda perplexity`: the perplexity of a model on a text, and the KL divergence of its
// predictions from a saved base run: llama.cpp's llama-perplexity (and its --kl-divergence), by
// the same definitions, so the figures compare.
//
// The text is tokenized once and cut into chunks of --ctx tokens; each chunk starts over from an
// empty cache with its first token replaced by BOS, and the second half of it is scored: at
// positions j in [ctx / 2, ctx - 1) the log-probability of token j + 1. Perplexity = exp(mean
// negative log-likelihood). The model runs directly (no scheduler): one sequence, fed in slices
// of --batch-size tokens through a paged cache.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/pagoda/commands.h"
#include "apps/pagoda/perplexity.h"
#include "model/kv_cache.h"

namespace pagoda::app {
namespace {

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return not_found(path + ": cannot open the text file");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

Status write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(2) << "\n";
  out.close();
  if (!out) return io_error(path + ": cannot write");
  return Status::ok_status();
}

}  // namespace

int run_perplexity(const PerplexityFlags& f) {
  if (f.ctx < 4) return fail(invalid_argument("--ctx must be at least 4"));
  if (f.batch_size < 1) return fail(invalid_argument("--batch-size must be at least 1"));
  if (f.chunks < 0) return fail(invalid_argument("--chunks must be >= 0 (0: every whole chunk of the text)"));
  const std::optional<KvCacheDtype> cache_dtype = parse_kv_cache_dtype(f.kv_cache_dtype);
  if (!cache_dtype) {
    return fail(invalid_argument("--kv-cache-dtype " + f.kv_cache_dtype +
                                 " is not supported (auto, float32, bfloat16, float16, fp8, fp8_e4m3, fp8_e5m2, int8)"));
  }
  if (!f.save_logits.empty() && !f.kl_base.empty()) {
    return fail(invalid_argument("--save-logits and --kl-base are two runs: the base run saves, the other compares"));
  }
  auto text = read_text(f.text_file);
  if (!text.ok()) return fail(text.status());
  auto loaded = load_model_and_tokenizer(f.model);
  if (!loaded.ok()) return fail(loaded.status());
  Model& model = *loaded->model;
  const Tokenizer& tokenizer = *loaded->tokenizer;
  const int64_t vocab = model.config().vocab_size;
  if (f.ctx > model.config().max_position_embeddings) {
    return fail(invalid_argument("--ctx " + std::to_string(f.ctx) + " is longer than the model's context of " +
                                 std::to_string(model.config().max_position_embeddings) + " tokens"));
  }

  const std::vector<TokenId> all = tokenizer.encode(*text, /*add_special=*/false);
  const int64_t available = static_cast<int64_t>(all.size()) / f.ctx;
  if (available == 0) {
    return fail(invalid_argument(f.text_file + " has " + std::to_string(all.size()) + " tokens; --ctx " +
                                 std::to_string(f.ctx) + " needs at least that many"));
  }
  const int64_t chunks = f.chunks > 0 ? std::min(f.chunks, available) : available;
  const int64_t first = f.ctx / 2;  // the first scored position of a chunk
  const int64_t scored_per_chunk = f.ctx - 1 - first;
  std::vector<TokenId> tokens(all.begin(), all.begin() + chunks * f.ctx);
  if (const auto bos = tokenizer.bos_id()) {
    for (int64_t c = 0; c < chunks; ++c) tokens[static_cast<size_t>(c * f.ctx)] = *bos;
  }

  const LogitsFileHeader header{vocab, f.ctx, chunks, scored_per_chunk};
  std::unique_ptr<LogitsWriter> writer;
  std::unique_ptr<LogitsReader> reader;
  if (!f.save_logits.empty()) {
    auto w = LogitsWriter::create(f.save_logits, header, tokens);
    if (!w.ok()) return fail(w.status());
    writer = std::move(*w);
  }
  if (!f.kl_base.empty()) {
    auto r = LogitsReader::open(f.kl_base, header, tokens);
    if (!r.ok()) return fail(r.status());
    reader = std::move(*r);
  }

  constexpr int64_t kBlockSize = 16;
  const int64_t num_blocks = (f.ctx + kBlockSize - 1) / kBlockSize;
  auto kv = KvCacheTensors::allocate(model.kernels(), model.config(), num_blocks, kBlockSize, *cache_dtype);
  if (!kv.ok()) return fail(kv.status());
  std::vector<BlockId> block_table(static_cast<size_t>(num_blocks));
  for (int64_t b = 0; b < num_blocks; ++b) block_table[static_cast<size_t>(b)] = static_cast<BlockId>(b);

  std::printf("perplexity: %lld tokens in %s, %lld chunks of %lld (scoring the last %lld of each), vocabulary %lld\n",
              static_cast<long long>(all.size()), f.text_file.c_str(), static_cast<long long>(chunks),
              static_cast<long long>(f.ctx), static_cast<long long>(scored_per_chunk), static_cast<long long>(vocab));
  PerplexityStats stats;
  std::vector<float> logits, logprobs(static_cast<size_t>(vocab)), base(reader ? static_cast<size_t>(vocab) : 0);
  std::vector<int32_t> positions;
  std::vector<int64_t> slots, rows;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < chunks; ++c) {
    const TokenId* chunk = tokens.data() + c * f.ctx;
    for (int64_t done = 0; done < f.ctx; done += f.batch_size) {
      const int64_t n = std::min(f.batch_size, f.ctx - done);
      positions.clear();
      slots.clear();
      rows.clear();
      for (int64_t i = done; i < done + n; ++i) {
        positions.push_back(static_cast<int32_t>(i));
        slots.push_back(i);  // block b holds slots [16 b, 16 b + 16): the identity table
        if (i >= first && i < f.ctx - 1) rows.push_back(i - done);
      }
      const AttentionSeq seq{0, n, done + n, block_table.data()};
      const ForwardBatch batch{std::span<const TokenId>(chunk + done, static_cast<size_t>(n)), positions, slots,
                               {&seq, 1}};
      const Tensor hidden = model.forward(batch, *kv);
      if (rows.empty()) continue;
      logits.resize(rows.size() * static_cast<size_t>(vocab));
      model.compute_logits(hidden, rows.data(), static_cast<int64_t>(rows.size()), logits.data());
      for (size_t r = 0; r < rows.size(); ++r) {
        const int64_t pos = done + rows[r];
        log_softmax(std::span<const float>(logits).subspan(r * static_cast<size_t>(vocab), static_cast<size_t>(vocab)),
                    logprobs);
        if (writer) {
          if (Status st = writer->write(logprobs); !st.ok()) return fail(st);
        }
        if (reader) {
          if (Status st = reader->read(base); !st.ok()) return fail(st);
        }
        stats.add(logprobs, chunk[pos + 1], base);
      }
    }
    std::printf("[%lld]%.4f%s", static_cast<long long>(c + 1), stats.ppl(), c + 1 == chunks ? "\n" : ",");
    std::fflush(stdout);
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (writer) {
    if (Status st = writer->close(); !st.ok()) return fail(st);
  }

  std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored, %.2f s, %.1f tokens/s)\n", stats.ppl(),
              stats.ppl_stderr(), static_cast<long long>(stats.count()), seconds,
              static_cast<double>(chunks * f.ctx) / seconds);
  nlohmann::json j = {{"model", f.model.model},
                      {"text_file", f.text_file},
                      {"ctx", f.ctx},
                      {"chunks", chunks},
                      {"tokens_scored", stats.count()},
                      {"ppl", stats.ppl()},
                      {"ppl_stderr", stats.ppl_stderr()},
                      {"mean_nll", stats.mean_nll()},
                      {"seconds", seconds},
                      {"weight_bytes", model.weight_bytes()}};
  if (!f.model.dtype.empty() && f.model.dtype != "auto") j["dtype"] = f.model.dtype;
  if (!f.model.quantization.empty()) j["quantization"] = f.model.quantization;
  j["kv_cache_dtype"] = std::string(kv_cache_dtype_name(*cache_dtype));
  if (reader) {
    std::printf("Base PPL = %.4f; ln(PPL / base PPL) = %.6f +/- %.6f\n", stats.base_ppl(), stats.ln_ppl_ratio(),
                stats.ln_ppl_ratio_stderr());
    std::printf("Mean KLD = %.6f +/- %.6f; 99th percentile %.6f; median %.6f; maximum %.6f\n", stats.mean_kld(),
                stats.kld_stderr(), stats.kld_quantile(0.99), stats.kld_quantile(0.5), stats.max_kld());
    std::printf("Same top token: %.3f%%\n", 100 * stats.top1_agreement());
    j["kl"] = {{"base_ppl", stats.base_ppl()},       {"ln_ppl_ratio", stats.ln_ppl_ratio()},
               {"ln_ppl_ratio_stderr", stats.ln_ppl_ratio_stderr()}, {"mean_kld", stats.mean_kld()},
               {"kld_stderr", stats.kld_stderr()},   {"kld_p99", stats.kld_quantile(0.99)},
               {"kld_median", stats.kld_quantile(0.5)}, {"kld_max", stats.max_kld()},
               {"top1_agreement", stats.top1_agreement()}};
  }
  if (!f.output_json.empty()) {
    if (Status st = write_json(f.output_json, j); !st.ok()) return fail(st);
  }
  return 0;
}

}  // namespace pagoda::app
