// The OffloadingConnector end to end on a real model (stories260K): prefix blocks the KV cache has
// evicted come back from the host tier, and after a restart from the disk tier, instead of being
// recomputed; the text is the text of an engine without tiers, token for token (greedy and
// seeded); a corrupt or foreign file is never used; no KV block leaks.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>

#include "engine/llm.h"
#include "support/engine_core.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

namespace fs = std::filesystem;

constexpr const char* kModel = "stories260K/stories260K.gguf";
constexpr int64_t kBlockSize = 16;
constexpr int64_t kPromptLen = 150;  // 9 full blocks, the 10th partial

// A small KV cache: three 150-token prompts do not fit in it together, so the third evicts the
// first's cached blocks.
EngineConfig small_cache() {
  EngineConfig c;
  c.block_size = kBlockSize;
  c.scheduler.max_model_len = 192;
  c.kv_cache_memory = 1;  // replaced below, once the block size in bytes is known
  return c;
}

int64_t block_bytes(const std::string& model) {
  auto probe = testing::make_engine_core(model, EngineConfig{});
  return probe ? probe->core().kv_cache_bytes() / probe->core().num_blocks() : 0;
}

EngineConfig with_blocks(EngineConfig c, int64_t bytes_per_block, int64_t blocks) {
  c.kv_cache_memory = bytes_per_block * blocks;
  return c;
}

EngineConfig with_tiers(EngineConfig c, int64_t host_blocks, const std::string& disk = "") {
  c.kv_transfer.kv_connector = "OffloadingConnector";
  c.kv_transfer.num_cpu_blocks = host_blocks;
  c.kv_transfer.disk_path = disk;
  return c;
}

GenerateRequest prompt(uint32_t seed, const SamplingParams& p) {
  std::mt19937 rng(seed);
  GenerateRequest r;
  // Ids from the vocabulary's middle (stories260K has 512): real tokens, no specials.
  for (int64_t i = 0; i < kPromptLen; ++i) r.prompt_token_ids.push_back(static_cast<TokenId>(10 + rng() % 400));
  r.params = p;
  return r;
}

SamplingParams greedy() {
  SamplingParams p;
  p.temperature = 0;
  p.max_tokens = 12;
  return p;
}

SamplingParams seeded() {
  SamplingParams p;
  p.temperature = 0.9;
  p.seed = 7;
  p.max_tokens = 12;
  return p;
}

std::vector<TokenId> run(LLM& llm, const GenerateRequest& r) {
  auto out = llm.generate(std::vector<GenerateRequest>{r});
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? (*out)[0].outputs[0].token_ids : std::vector<TokenId>{};
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/pagoda-kv-offload-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() { fs::remove_all(path); }
};

// The first prompt again after two others evicted its blocks: loaded from the host tier.
TEST(KvOffload, HostTierServesEvictedPrefixWithTheSameTokens) {
  PAGODA_TEST_FILE(model, kModel);
  const int64_t bb = block_bytes(model);
  ASSERT_GT(bb, 0);
  for (const SamplingParams& p : {greedy(), seeded()}) {
    LLM plain(testing::make_engine_core(model, with_blocks(small_cache(), bb, 24)));
    LLM tiered(testing::make_engine_core(model, with_tiers(with_blocks(small_cache(), bb, 24), 64)));
    const GenerateRequest a = prompt(1, p), b = prompt(2, p), c = prompt(3, p);
    const std::vector<TokenId> want = run(plain, a);
    ASSERT_EQ(want.size(), 12u);
    EXPECT_EQ(run(tiered, a), want);
    EXPECT_EQ(run(tiered, b), run(plain, b));
    EXPECT_EQ(run(tiered, c), run(plain, c));
    const KvConnectorStats before = *tiered.core().connector_stats();
    EXPECT_EQ(before.hits, 0);
    // The 10 full blocks of each (150 prompt tokens and 11 computed output tokens) went into the tier.
    EXPECT_EQ(before.moved.stored_blocks, 3 * 10);
    const PrefixCacheStats cache_before = tiered.core().stats().prefix_cache;
    EXPECT_EQ(run(tiered, a), want);
    const KvConnectorStats after = *tiered.core().connector_stats();
    const PrefixCacheStats cache_after = tiered.core().stats().prefix_cache;
    // Every full block of a came back, from the tier or (the ones c left) the cache itself.
    const int64_t from_cache = cache_after.hits - cache_before.hits;
    EXPECT_GT(after.hits, 0);
    EXPECT_EQ(after.hits + from_cache, 9 * kBlockSize);
    EXPECT_EQ(after.moved.loaded_blocks * kBlockSize, after.hits);
    EXPECT_EQ(after.failed_loads, 0);
    // Nothing leaks: every block is free again.
    EXPECT_EQ(tiered.core().stats().kv_usage, 0.0);
    EXPECT_EQ(tiered.core().stats().num_waiting, 0);
  }
}

// A restart: the disk tier's files bring the prefix back; a flipped byte gets the file refused
// (the tokens are computed instead, and still the same); another KV layout finds nothing.
TEST(KvOffload, DiskTierSurvivesRestartAndRefusesCorruptFiles) {
  PAGODA_TEST_FILE(model, kModel);
  const int64_t bb = block_bytes(model);
  ASSERT_GT(bb, 0);
  TempDir dir;
  const GenerateRequest a = prompt(11, greedy());
  const EngineConfig config = with_tiers(with_blocks(small_cache(), bb, 24), 64, dir.path);
  std::vector<TokenId> want;
  {
    LLM plain(testing::make_engine_core(model, with_blocks(small_cache(), bb, 24)));
    want = run(plain, a);
  }
  {
    LLM first(testing::make_engine_core(model, config));
    EXPECT_EQ(run(first, a), want);
  }  // the engine stops: its queued writes land
  int files = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) files += e.path().extension() == ".kvb";
  EXPECT_EQ(files, 10);
  {
    LLM second(testing::make_engine_core(model, config));
    EXPECT_EQ(second.core().connector_stats()->disk_blocks, 10);
    EXPECT_EQ(run(second, a), want);
    const KvConnectorStats s = *second.core().connector_stats();
    EXPECT_EQ(s.hits, 9 * kBlockSize);
    EXPECT_EQ(s.disk_hits, 9 * kBlockSize);
    EXPECT_EQ(s.moved.disk_loaded_blocks, 9);
    EXPECT_EQ(second.core().stats().kv_usage, 0.0);
  }
  // Another KV cache dtype is another layout: its engine sees none of these files.
  {
    EngineConfig f16 = config;
    f16.kv_cache_dtype = KvCacheDtype::kF16;
    LLM other(testing::make_engine_core(model, f16));
    EXPECT_EQ(other.core().connector_stats()->disk_blocks, 0);
  }
  // Flip one payload byte in every file: each is refused at load, and the request computes.
  for (const auto& e : fs::directory_iterator(dir.path)) {
    if (e.path().extension() != ".kvb") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    char c = 0;
    f.get(c);
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(c ^ 0x40));
  }
  {
    LLM third(testing::make_engine_core(model, config));
    EXPECT_EQ(run(third, a), want);
    const KvConnectorStats s = *third.core().connector_stats();
    EXPECT_EQ(s.hits, 0);
    EXPECT_EQ(s.failed_loads, 1);
    EXPECT_GT(s.moved.failed_blocks, 0);
    EXPECT_EQ(third.core().stats().kv_usage, 0.0);
  }
}

}  // namespace
}  // namespace pagoda
