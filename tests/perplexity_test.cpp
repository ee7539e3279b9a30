// `pagoda perplexity`: its arithmetic on distributions worked out by hand, its logits file, and
// the command on the real stories260K against a computation written here from llama.cpp's
// definition (chunks of ctx tokens, BOS first, the second half scored), on the scalar kernels.
#include "apps/pagoda/perplexity.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "apps/pagoda/commands.h"
#include "backend/cpu/cpu_backend.h"
#include "loader/gguf_file.h"
#include "loader/model_source.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "support/test_data.h"
#include "tokenizer/tokenizer.h"

namespace pagoda::app {
namespace {

std::vector<float> logs(std::vector<double> p) {
  std::vector<float> out;
  for (double v : p) out.push_back(static_cast<float>(std::log(v)));
  return out;
}

TEST(Perplexity, LogSoftmaxOfKnownLogits) {
  // Logits 0, 0, ln 2 are probabilities 1/4, 1/4, 1/2 whatever is added to all three.
  for (float shift : {0.0f, 100.0f, -80.0f}) {
    const std::vector<float> logits = {shift, shift, shift + static_cast<float>(std::log(2.0))};
    std::vector<float> out(3);
    log_softmax(logits, out);
    EXPECT_NEAR(out[0], std::log(0.25), 1e-6) << shift;
    EXPECT_NEAR(out[1], std::log(0.25), 1e-6) << shift;
    EXPECT_NEAR(out[2], std::log(0.5), 1e-6) << shift;
  }
}

TEST(Perplexity, StatsOfHandWorkedPositions) {
  PerplexityStats s;
  // Position 1: base (1/2, 1/4, 1/4), this run (1/4, 1/2, 1/4), next token 0.
  //   NLL = ln 4; base NLL = ln 2; KL = 1/2 ln(2) + 1/4 ln(1/2) + 0 = ln(2) / 4; top tokens differ.
  s.add(logs({0.25, 0.5, 0.25}), 0, logs({0.5, 0.25, 0.25}));
  // Position 2: both (0.8, 0.1, 0.1), next token 1: NLL = base NLL = ln 10, KL 0, same top.
  s.add(logs({0.8, 0.1, 0.1}), 1, logs({0.8, 0.1, 0.1}));
  ASSERT_EQ(s.count(), 2);
  EXPECT_NEAR(s.mean_nll(), (std::log(4.0) + std::log(10.0)) / 2, 1e-6);
  EXPECT_NEAR(s.ppl(), std::sqrt(40.0), 1e-5);                // exp of the mean: the geometric mean
  EXPECT_NEAR(s.base_ppl(), std::sqrt(20.0), 1e-5);
  EXPECT_NEAR(s.mean_kld(), std::log(2.0) / 8, 1e-6);
  EXPECT_NEAR(s.max_kld(), std::log(2.0) / 4, 1e-6);
  EXPECT_NEAR(s.kld_quantile(0.5), std::log(2.0) / 8, 1e-6);  // halfway between 0 and ln(2) / 4
  EXPECT_NEAR(s.kld_quantile(0.99), 0.99 * std::log(2.0) / 4, 1e-6);
  EXPECT_DOUBLE_EQ(s.top1_agreement(), 0.5);
  // Standard error of the mean NLL: |ln 4 - ln 10| / 2 for two samples.
  EXPECT_NEAR(s.ppl_stderr(), std::sqrt(40.0) * std::fabs(std::log(4.0) - std::log(10.0)) / 2, 1e-5);
  // ln(PPL / base PPL): the mean of the per-token differences ln 4 - ln 2 = ln 2 and 0, with the
  // standard error of that mean, |ln 2 - 0| / 2.
  EXPECT_NEAR(s.ln_ppl_ratio(), std::log(2.0) / 2, 1e-6);
  EXPECT_NEAR(s.ln_ppl_ratio(), std::log(s.ppl() / s.base_ppl()), 1e-9);
  EXPECT_NEAR(s.ln_ppl_ratio_stderr(), std::log(2.0) / 2, 1e-6);
}

TEST(Perplexity, LogitsFileRoundTripsAndRefusesAnotherRun) {
  const std::string path = pagoda::testing::make_temp_dir() + "/ppl_logits.bin";
  const LogitsFileHeader h{3, 4, 2, 1};
  const std::vector<TokenId> tokens = {1, 2, 0, 1, 1, 0, 2, 2};
  {
    auto w = LogitsWriter::create(path, h, tokens);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->write(logs({0.5, 0.25, 0.25})).ok());
    ASSERT_TRUE((*w)->write(logs({0.1, 0.1, 0.8})).ok());
    ASSERT_TRUE((*w)->close().ok());
  }
  auto r = LogitsReader::open(path, h, tokens);
  ASSERT_TRUE(r.ok()) << r.status().message();
  std::vector<float> got(3);
  ASSERT_TRUE((*r)->read(got).ok());
  EXPECT_EQ(got, logs({0.5, 0.25, 0.25}));
  ASSERT_TRUE((*r)->read(got).ok());
  EXPECT_EQ(got, logs({0.1, 0.1, 0.8}));
  EXPECT_EQ((*r)->read(got).code(), StatusCode::kDataLoss);  // no third position

  auto other_vocab = LogitsReader::open(path, {4, 4, 2, 1}, tokens);
  ASSERT_FALSE(other_vocab.ok());
  EXPECT_NE(other_vocab.status().message().find("vocabulary size 3, this run 4"), std::string::npos)
      << other_vocab.status().message();
  std::vector<TokenId> other_tokens = tokens;
  other_tokens[5] = 2;
  auto other_text = LogitsReader::open(path, h, other_tokens);
  ASSERT_FALSE(other_text.ok());
  EXPECT_NE(other_text.status().message().find("token 5"), std::string::npos) << other_text.status().message();
  { std::ofstream(path, std::ios::binary) << "not a logits file"; }
  auto garbage = LogitsReader::open(path, h, tokens);
  EXPECT_EQ(garbage.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(garbage.status().message().find(path), std::string::npos);
  std::filesystem::remove(path);
}

nlohmann::json run(PerplexityFlags f, const std::string& json_path) {
  cpu::register_cpu_backend();  // as main() does
  f.output_json = json_path;
  EXPECT_EQ(run_perplexity(f), 0);
  std::ifstream in(json_path);
  return nlohmann::json::parse(in);
}

// The command on stories260K, ctx 64 and slices of 24 tokens, against the same definition
// computed here: one pass per chunk on the scalar kernels, log-softmax in double.
TEST(Perplexity, Stories260KMatchesTheDefinition) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  const std::string text_path = std::string(PAGODA_SOURCE_DIR) + "/tests/data/short-stories.txt";
  const int64_t ctx = 64, chunks = 6;

  auto gguf = GgufFile::open(model_path);
  ASSERT_TRUE(gguf.ok());
  auto tokenizer = load_gguf_tokenizer(**gguf);
  ASSERT_TRUE(tokenizer.ok());
  std::ifstream in(text_path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<TokenId> tokens = (*tokenizer)->encode(text.str(), false);
  ASSERT_GE(static_cast<int64_t>(tokens.size()), ctx * chunks);
  auto backend = cpu::CpuBackend::create(cpu::CpuBackendOptions{.isa = "scalar"});
  ASSERT_TRUE(backend.ok());
  auto src = load_model(model_path, LoadOptions{});
  ASSERT_TRUE(src.ok());
  auto model = create_model(std::move(*src), **backend);
  ASSERT_TRUE(model.ok());
  const int64_t vocab = (*model)->config().vocab_size;
  auto kv = KvCacheTensors::allocate((*model)->kernels(), (*model)->config(), ctx / 16, 16);
  ASSERT_TRUE(kv.ok());
  std::vector<BlockId> table = {0, 1, 2, 3};
  double nll = 0;
  int64_t scored = 0;
  for (int64_t c = 0; c < chunks; ++c) {
    std::vector<TokenId> chunk(tokens.begin() + c * ctx, tokens.begin() + (c + 1) * ctx);
    chunk[0] = 1;  // BOS
    std::vector<int32_t> pos;
    std::vector<int64_t> slots, rows;
    for (int64_t i = 0; i < ctx; ++i) {
      pos.push_back(static_cast<int32_t>(i));
      slots.push_back(i);
      rows.push_back(i);
    }
    const AttentionSeq seq{0, ctx, ctx, table.data()};
    const Tensor hidden = (*model)->forward(ForwardBatch{chunk, pos, slots, {&seq, 1}}, *kv);
    std::vector<float> logits(static_cast<size_t>(ctx * vocab));
    (*model)->compute_logits(hidden, rows.data(), ctx, logits.data());
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      const float* l = logits.data() + j * vocab;
      double max = l[0], sum = 0;
      for (int64_t v = 0; v < vocab; ++v) max = std::max(max, double{l[v]});
      for (int64_t v = 0; v < vocab; ++v) sum += std::exp(double{l[v]} - max);
      nll += max + std::log(sum) - l[chunk[static_cast<size_t>(j + 1)]];
      ++scored;
    }
  }
  const double want_ppl = std::exp(nll / static_cast<double>(scored));

  PerplexityFlags f;
  f.model.model = model_path;
  f.text_file = text_path;
  f.ctx = ctx;
  f.chunks = chunks;
  f.batch_size = 24;
  const std::string dir = testing::make_temp_dir();
  f.save_logits = dir + "/base.bin";
  const nlohmann::json base = run(f, dir + "/base.json");
  EXPECT_EQ(base["tokens_scored"].get<int64_t>(), scored);
  EXPECT_NEAR(base["ppl"].get<double>(), want_ppl, 1e-4 * want_ppl);
  // stories260K was trained to a validation loss of 1.297 (perplexity 3.66) on such stories.
  EXPECT_GT(want_ppl, 2.5);
  EXPECT_LT(want_ppl, 6.0);

  // Against itself: no divergence at all. Against q8_0 and q4_0 weights: some, q4_0 more.
  f.save_logits.clear();
  f.kl_base = dir + "/base.bin";
  const nlohmann::json self = run(f, dir + "/self.json");
  EXPECT_EQ(self["kl"]["mean_kld"].get<double>(), 0.0);
  EXPECT_EQ(self["kl"]["top1_agreement"].get<double>(), 1.0);
  EXPECT_NEAR(self["kl"]["base_ppl"].get<double>(), base["ppl"].get<double>(), 1e-9);
  f.model.dtype = "q8_0";
  const nlohmann::json q8 = run(f, dir + "/q8.json");
  f.model.dtype = "auto";
  f.model.quantization = "q4_0";
  const nlohmann::json q4 = run(f, dir + "/q4.json");
  f.model.quantization = "w8a8";
  const nlohmann::json w8a8 = run(f, dir + "/w8a8.json");
  EXPECT_GT(q8["kl"]["mean_kld"].get<double>(), 0.0);
  EXPECT_LT(q8["kl"]["mean_kld"].get<double>(), 0.01);
  EXPECT_GT(w8a8["kl"]["mean_kld"].get<double>(), 0.0);
  EXPECT_LT(w8a8["kl"]["mean_kld"].get<double>(), 0.01);
  EXPECT_LT(w8a8["weight_bytes"].get<int64_t>(), base["weight_bytes"].get<int64_t>());
  EXPECT_GT(q4["kl"]["mean_kld"].get<double>(), 2 * q8["kl"]["mean_kld"].get<double>());
  EXPECT_LT(q4["weight_bytes"].get<int64_t>(), q8["weight_bytes"].get<int64_t>());
  EXPECT_LT(q8["weight_bytes"].get<int64_t>(), base["weight_bytes"].get<int64_t>());
  // A base run of another --ctx is refused, naming it.
  f.ctx = 32;
  f.output_json.clear();
  EXPECT_EQ(run_perplexity(f), 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace pagoda::app
