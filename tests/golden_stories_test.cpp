// Golden end-to-end test on a real trained model: stories260K (llama2.c, GGUF) from BOS alone,
// greedy, 256 tokens, must reproduce the independently generated ids and text in
// shared/models/stories260K exactly.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "launch/engine_setup.h"
#include "engine/llm.h"
#include "backend/cpu/cpu_backend.h"
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
  auto setup = app::make_engine(flags, app::EngineFlags{});
  ASSERT_TRUE(setup.ok()) << setup.status().message();
  std::shared_ptr<const Tokenizer> tokenizer = setup->tokenizer;
  LLM llm(std::move(setup->engine));

  GenerateRequest request;
  request.prompt = "";  // BOS alone
  request.params.max_tokens = 256;
  request.params.temperature = 0;
  auto result = llm.generate({request});
  ASSERT_TRUE(result.ok()) << result.status().message();
  ASSERT_EQ((*result)[0].prompt_token_ids, std::vector<TokenId>{1});
  const std::vector<TokenId>& got = (*result)[0].outputs[0].token_ids;

  std::vector<TokenId> want = read_ids(ids_path);
  ASSERT_EQ(want.size(), 256u);
  EXPECT_EQ(got, want);

  std::string text = slurp(txt_path);
  ASSERT_TRUE(!text.empty() && text.back() == '\n');
  text.pop_back();  // the file's own final newline; the generated text ends with "you."
  EXPECT_EQ(tokenizer->decode(got, /*skip_special=*/true), text);
  EXPECT_EQ((*result)[0].outputs[0].text, text);  // the streamed, incrementally decoded text
}

}  // namespace
}  // namespace pagoda
