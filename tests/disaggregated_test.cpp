// Disaggregated prefill end to end on real models, two engines in one process talking over
// localhost: a prefill engine (kv_producer) computes the prompt and its first token, a decode
// engine (kv_consumer) loads the prompt's KV and goes on. The decode engine's tokens are a single
// engine's, token for token, on stories260K's golden text, greedy and seeded, and on a mixture of
// experts; it computes none of the prompt; when the prefill engine is gone the request computes
// its prompt and still gives the same tokens; no block leaks on either side.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/llm.h"
#include "support/engine_core.h"
#include "support/free_ports.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

int free_port() { return testing::free_tcp_ports(1); }

// The model's whole context.
EngineConfig plain() {
  EngineConfig c;
  c.scheduler.max_model_len = 0;
  return c;
}

// A decode engine needs no port of its own (port 0).
EngineConfig with_connector(const std::string& connector, const std::string& role, int port) {
  EngineConfig c = plain();
  auto kv = KvTransferConfig::parse("{\"kv_connector\": \"" + connector + "\", \"kv_role\": \"" + role + "\"" +
                                    (port > 0 ? ", \"kv_port\": " + std::to_string(port) : std::string()) + "}");
  EXPECT_TRUE(kv.ok()) << kv.status().message();
  c.kv_transfer = *kv;
  return c;
}

// What a prefill engine at `port` answers for `r` (as the server builds it): the parameters for
// the decode engine, with the first token. Fails the test when the prefill does.
KvTransferParams prefill(LLM& engine, GenerateRequest r, uint64_t transfer_id, int port) {
  r.kv_transfer = KvTransferParams{};
  r.kv_transfer->do_remote_decode = true;
  r.kv_transfer->transfer_id = transfer_id;
  r.params.max_tokens = 1;
  r.params.min_tokens = std::min<int64_t>(r.params.min_tokens, 1);
  auto out = engine.generate(std::vector<GenerateRequest>{r});
  EXPECT_TRUE(out.ok()) << out.status().message();
  KvTransferParams p;
  p.do_remote_prefill = true;
  p.remote_engine_id = "prefill";
  p.remote_host = "127.0.0.1";
  p.remote_port = port;
  p.remote_request_id = transfer_id;
  if (!out.ok()) return p;
  const CompletionOutput& o = (*out)[0].outputs[0];
  p.remote_num_tokens = static_cast<int64_t>((*out)[0].prompt_token_ids.size());
  KvFirstToken first;
  first.token = o.token_ids.at(0);
  if (!o.logprobs.empty()) {
    first.logprob = o.logprobs[0].logprob;
    for (const TokenLogprobEntry& e : o.logprobs[0].top_logprobs) first.top_logprobs.emplace_back(e.token, e.logprob);
  }
  p.first_token = first;
  return p;
}

std::vector<TokenId> decode(LLM& engine, GenerateRequest r, const KvTransferParams& p, std::string* text = nullptr) {
  r.kv_transfer = p;
  auto out = engine.generate(std::vector<GenerateRequest>{r});
  EXPECT_TRUE(out.ok()) << out.status().message();
  if (!out.ok()) return {};
  if (text != nullptr) *text = (*out)[0].outputs[0].text;
  return (*out)[0].outputs[0].token_ids;
}

std::vector<TokenId> single(LLM& engine, const GenerateRequest& r) {
  auto out = engine.generate(std::vector<GenerateRequest>{r});
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? (*out)[0].outputs[0].token_ids : std::vector<TokenId>{};
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

GenerateRequest long_prompt(uint32_t seed, const SamplingParams& p) {
  std::mt19937 rng(seed);
  GenerateRequest r;
  for (int i = 0; i < 90; ++i) r.prompt_token_ids.push_back(static_cast<TokenId>(10 + rng() % 400));
  r.params = p;
  return r;
}

// stories260K's golden greedy text through prefill + decode (the prompt is BOS alone), and
// longer prompts greedy and seeded, with logprobs: the decode engine's tokens and logprobs are a
// single engine's, and it computes no prompt token.
TEST(Disaggregated, GoldenTextGreedyAndSeededEqualOneEngine) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const int port = free_port();
  LLM one(testing::make_engine_core(model, plain()));
  LLM prefill_engine(testing::make_engine_core(model, with_connector("TcpConnector", "kv_producer", port)));
  for (const char* connector : {"TcpConnector", "ShmConnector"}) {
    SCOPED_TRACE(connector);
    LLM decode_engine(testing::make_engine_core(model, with_connector(connector, "kv_consumer", 0)));
    GenerateRequest bos;
    bos.prompt = "";
    bos.params.temperature = 0;
    bos.params.max_tokens = 256;
    std::string text;
    const std::vector<TokenId> got = decode(decode_engine, bos, prefill(prefill_engine, bos, 1, port), &text);
    std::string want = slurp(txt);
    want.pop_back();  // the file's final newline
    EXPECT_EQ(text, want);
    EXPECT_EQ(got, single(one, bos));

    SamplingParams seeded;
    seeded.temperature = 0.9;
    seeded.seed = 11;
    seeded.max_tokens = 40;
    seeded.logprobs = 2;
    SamplingParams greedy = seeded;
    greedy.temperature = 0;
    for (const SamplingParams& p : {seeded, greedy}) {
      const GenerateRequest r = long_prompt(p.temperature > 0 ? 3 : 4, p);  // two prompts: no local hit
      const std::vector<TokenId> want_ids = single(one, r);
      EXPECT_EQ(decode(decode_engine, r, prefill(prefill_engine, r, 2 + static_cast<uint64_t>(p.temperature > 0), port)),
                want_ids);
    }
    const KvConnectorStats s = *decode_engine.core().connector_stats();
    EXPECT_EQ(s.remote_hits, 1 + 2 * 90);  // every prompt token received, none computed
    EXPECT_EQ(s.remote_queries, s.remote_hits);
    EXPECT_EQ(s.failed_loads, 0);
    EXPECT_EQ(decode_engine.core().stats().kv_usage, 0.0);
  }
  EXPECT_EQ(prefill_engine.core().stats().kv_usage, 0.0);
}

// A decode engine whose own cache holds the prompt's first blocks reads only the rest.
TEST(Disaggregated, ALocalPrefixHitReadsOnlyTheRest) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const int port = free_port();
  LLM one(testing::make_engine_core(model, plain()));
  LLM prefill_engine(testing::make_engine_core(model, with_connector("TcpConnector", "kv_producer", port)));
  LLM decode_engine(testing::make_engine_core(model, with_connector("TcpConnector", "kv_consumer", 0)));
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 20;
  GenerateRequest a = long_prompt(5, greedy);
  EXPECT_EQ(single(decode_engine, a), single(one, a));  // computed locally: its blocks are cached
  GenerateRequest b = a;
  for (int i = 0; i < 30; ++i) b.prompt_token_ids.push_back(static_cast<TokenId>(20 + i));
  EXPECT_EQ(decode(decode_engine, b, prefill(prefill_engine, b, 7, port)), single(one, b));
  const KvConnectorStats s = *decode_engine.core().connector_stats();
  // a's 90 tokens hold five full blocks of 16, cached here: the other 40 of b's 120 came over.
  EXPECT_EQ(s.remote_hits, 120 - 5 * 16);
  EXPECT_EQ(decode_engine.core().stats().kv_usage, 0.0);
}

// The prefill engine is gone before the decode engine reads: the request computes its prompt,
// goes on from the first token it was given, and gives a single engine's tokens.
TEST(Disaggregated, APrefillEngineThatIsGoneMeansTheDecodeEngineComputes) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const int port = free_port();
  LLM one(testing::make_engine_core(model, plain()));
  LLM decode_engine(testing::make_engine_core(model, with_connector("TcpConnector", "kv_consumer", 0)));
  SamplingParams seeded;
  seeded.temperature = 0.8;
  seeded.seed = 3;
  seeded.max_tokens = 30;
  const GenerateRequest r = long_prompt(9, seeded);
  KvTransferParams p;
  {
    LLM prefill_engine(testing::make_engine_core(model, with_connector("TcpConnector", "kv_producer", port)));
    p = prefill(prefill_engine, r, 4, port);
  }
  EXPECT_EQ(decode(decode_engine, r, p), single(one, r));
  const KvConnectorStats s = *decode_engine.core().connector_stats();
  EXPECT_EQ(s.remote_hits, 0);
  EXPECT_EQ(s.failed_loads, 1);
  EXPECT_EQ(decode_engine.core().stats().kv_usage, 0.0);
  // Parameters for another prompt (the proxy mixed them up) are not used at all.
  KvTransferParams wrong = p;
  wrong.remote_num_tokens += 1;
  EXPECT_EQ(decode(decode_engine, r, wrong), single(one, r));
  EXPECT_EQ(decode_engine.core().connector_stats()->failed_loads, 1);
}

// A mixture of experts (a dummy Qwen3-MoE, q4_0): the decode engine's greedy tokens are a single
// engine's.
TEST(Disaggregated, MixtureOfExpertsEqualsOneEngine) {
  PAGODA_TEST_FILE(tokenizer, "stories260K/stories260K.gguf");
  const std::string dir = testing::make_temp_dir();
  std::ofstream(dir + "/config.json") << R"({"architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 128,
      "intermediate_size": 256, "moe_intermediate_size": 64, "num_experts": 16, "num_experts_per_tok": 4,
      "norm_topk_prob": true, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 512, "rms_norm_eps": 1e-6,
      "rope_theta": 1000000.0, "tie_word_embeddings": false})";
  app::ModelFlags flags;
  flags.model = dir;
  flags.load_format = "dummy";
  flags.dtype = "q4_0";
  flags.tokenizer = tokenizer;
  const int port = free_port();
  LLM one(testing::make_engine_core(flags, plain()));
  LLM prefill_engine(testing::make_engine_core(flags, with_connector("TcpConnector", "kv_producer", port)));
  LLM decode_engine(testing::make_engine_core(flags, with_connector("TcpConnector", "kv_consumer", 0)));
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 24;
  for (uint32_t seed : {1u, 2u}) {
    const GenerateRequest r = long_prompt(seed, greedy);
    EXPECT_EQ(decode(decode_engine, r, prefill(prefill_engine, r, seed, port)), single(one, r));
  }
  EXPECT_EQ(decode_engine.core().connector_stats()->remote_hits, 2 * 90);
  std::filesystem::remove_all(dir);
}

// A MultiConnector on the decode engine: prompts come from the prefill engine (TcpConnector), and
// what its small cache evicts is kept in a host tier (OffloadingConnector) and loaded from there
// when the prompt comes again without kv_transfer_params.
TEST(Disaggregated, MultiConnectorTransfersAndOffloads) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const int port = free_port();
  LLM one(testing::make_engine_core(model, plain()));
  LLM prefill_engine(testing::make_engine_core(model, with_connector("TcpConnector", "kv_producer", port)));
  EngineConfig multi = plain();
  auto kv = KvTransferConfig::parse(R"({"kv_connector": "MultiConnector", "kv_role": "kv_consumer",
      "kv_connector_extra_config": {"connectors": [
        {"kv_connector": "TcpConnector", "kv_role": "kv_consumer"},
        {"kv_connector": "OffloadingConnector", "kv_connector_extra_config": {"num_cpu_blocks": 64}}]}})");
  ASSERT_TRUE(kv.ok()) << kv.status().message();
  multi.kv_transfer = *kv;
  multi.scheduler.max_model_len = 192;
  {
    auto probe = testing::make_engine_core(model, plain());
    multi.kv_cache_memory = probe->core().kv_cache_bytes() / probe->core().num_blocks() * 12;  // two prompts
  }
  LLM decode_engine(testing::make_engine_core(model, multi));
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 12;
  const GenerateRequest a = long_prompt(21, greedy), b = long_prompt(22, greedy), c = long_prompt(23, greedy);
  EXPECT_EQ(decode(decode_engine, a, prefill(prefill_engine, a, 31, port)), single(one, a));
  EXPECT_EQ(single(decode_engine, b), single(one, b));
  EXPECT_EQ(single(decode_engine, c), single(one, c));
  const KvConnectorStats before = *decode_engine.core().connector_stats();
  EXPECT_EQ(before.remote_hits, 90);
  EXPECT_EQ(single(decode_engine, a), single(one, a));  // a again, its blocks evicted meanwhile
  const KvConnectorStats after = *decode_engine.core().connector_stats();
  EXPECT_GT(after.hits, before.hits);  // from the host tier
  EXPECT_EQ(after.failed_loads, 0);
  EXPECT_EQ(decode_engine.core().stats().kv_usage, 0.0);
}

// Every KV cache dtype and a few block sizes: the decode engine's greedy tokens are one engine's.
// A decode engine whose KV layout differs from the prefill engine's is refused at the handshake
// and computes the prompt itself.
TEST(Disaggregated, EveryKvDtypeAndBlockSizeAndAMismatchRefused) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  SamplingParams greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 16;
  const GenerateRequest r = long_prompt(8, greedy);
  for (const auto& [dtype, block_size] : std::vector<std::pair<KvCacheDtype, int32_t>>{
           {KvCacheDtype::kF16, 8}, {KvCacheDtype::kBF16, 32}, {KvCacheDtype::kFp8E4M3, 16},
           {KvCacheDtype::kFp8E5M2, 1}, {KvCacheDtype::kInt8, 16}}) {
    SCOPED_TRACE(std::string(kv_cache_dtype_name(dtype)) + ", blocks of " + std::to_string(block_size));
    const int port = free_port();
    EngineConfig base = plain();
    base.kv_cache_dtype = dtype;
    base.block_size = block_size;
    EngineConfig producer = with_connector("TcpConnector", "kv_producer", port);
    producer.kv_cache_dtype = dtype;
    producer.block_size = block_size;
    EngineConfig consumer = with_connector("TcpConnector", "kv_consumer", 0);
    consumer.kv_cache_dtype = dtype;
    consumer.block_size = block_size;
    LLM one(testing::make_engine_core(model, base));
    LLM prefill_engine(testing::make_engine_core(model, producer));
    LLM decode_engine(testing::make_engine_core(model, consumer));
    EXPECT_EQ(decode(decode_engine, r, prefill(prefill_engine, r, 40, port)), single(one, r));
    EXPECT_EQ(decode_engine.core().connector_stats()->remote_hits, 90);
    // Another block size on the decode side: refused, computed, the same tokens.
    EngineConfig other = consumer;
    other.block_size = block_size == 16 ? 32 : 16;
    EngineConfig other_base = base;
    other_base.block_size = other.block_size;
    LLM mismatched(testing::make_engine_core(model, other));
    LLM one_other(testing::make_engine_core(model, other_base));
    EXPECT_EQ(decode(mismatched, r, prefill(prefill_engine, r, 41, port)), single(one_other, r));
    EXPECT_EQ(mismatched.core().connector_stats()->failed_loads, 1);
    EXPECT_EQ(mismatched.core().stats().kv_usage, 0.0);
  }
}

}  // namespace
}  // namespace pagoda
