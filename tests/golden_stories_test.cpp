// Golden end-to-end test on a real trained model: stories260K (llama2.c, GGUF) from BOS alone,
// greedy, 256 tokens, must reproduce the independently generated ids and text in
// shared/models/stories260K exactly.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "apps/pagoda/generate.h"
#include "apps/pagoda/model_loading.h"
#include "backends/cpu/cpu_backend.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<TokenId> read_ids(const std::string& path) {
  std::ifstream in(path);
  std::vector<TokenId> ids;
  for (TokenId id; in >> id;) ids.push_back(id);
  return ids;
}

TEST(GoldenStories260K, GreedyFromBosMatchesReference) {
  PAGODA_TEST_FILE(model_path, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(ids_path, "stories260K/greedy-bos-256.ids");
  PAGODA_TEST_FILE(txt_path, "stories260K/greedy-bos-256.txt");
  cpu::register_cpu_backend();
  app::ModelFlags flags;
  flags.model = model_path;
  auto loaded = app::load_model_and_tokenizer(flags);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();

  std::vector<TokenId> prompt = loaded->tokenizer->encode("", /*add_special=*/true);
  ASSERT_EQ(prompt, std::vector<TokenId>{1});  // BOS alone
  app::GenerateOptions options;
  options.max_tokens = 256;
  options.sampling.temperature = 0;
  std::vector<TokenId> got;
  auto stats = app::generate(*loaded, prompt, options, [&](TokenId id) { got.push_back(id); });
  ASSERT_TRUE(stats.ok()) << stats.status().message();

  std::vector<TokenId> want = read_ids(ids_path);
  ASSERT_EQ(want.size(), 256u);
  EXPECT_EQ(got, want);

  std::string text = slurp(txt_path);
  ASSERT_TRUE(!text.empty() && text.back() == '\n');
  text.pop_back();  // the file's own final newline; the generated text ends with "you."
  EXPECT_EQ(loaded->tokenizer->decode(got, /*skip_special=*/true), text);
}

}  // namespace
}  // namespace pagoda
