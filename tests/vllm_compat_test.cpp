// vLLM users' command lines and request habits, run unchanged against the pagoda binary: the
// serve lines of the guides they follow, vLLM's flags (same meaning, accepted with no effect, or
// refused at once naming the flag), --generation-config, --help groups, and the one request path
// that `pagoda generate` shares with the server.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/safetensors_writer.h"
#include "support/cli_run.h"
#include "support/server_process.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

using nlohmann::json;
using testing::RunResult;
using testing::shell_quote;

RunResult run_pagoda(const std::string& args, const std::string& env = "") {
  return testing::run_binary(PAGODA_BINARY, args, env);
}

using testing::count_lines;

// A Hugging Face model folder as a user downloads one: config.json (Qwen2, 32k context),
// model.safetensors with random bf16 weights, and the Mistral tokenizer's files (32000 tokens).
// Small (hidden 64, two layers), so it loads in a moment; its text is noise. w8a8: as
// llm-compressor writes a W8A8 checkpoint: every projection int8 ("weight", I8) with a bf16
// "weight_scale" [out, 1], and compressed-tensors' quantization_config in config.json. awq: as
// AutoAWQ writes one: every projection as random int4 codes and zero points ("qweight", "qzeros"
// I32, GEMM packing) with f16 "scales" per group of 32 inputs, and its quantization_config.
std::string write_model_folder(const std::string& tokenizer_dir, const std::string& quant = "") {
  const bool w8a8 = quant == "w8a8", awq = quant == "awq";
  namespace fs = std::filesystem;
  const std::string dir = testing::make_temp_dir() + "/qwen2-tiny";
  fs::create_directories(dir);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(tokenizer_dir + "/" + f, dir + "/" + f);
  const int64_t vocab = 32000, hidden = 64, inter = 128, layers = 2, heads = 4, kv_heads = 2, head_dim = 16;
  std::ofstream(dir + "/config.json") << json{{"architectures", {"Qwen2ForCausalLM"}},
                                              {"model_type", "qwen2"},
                                              {"vocab_size", vocab},
                                              {"hidden_size", hidden},
                                              {"intermediate_size", inter},
                                              {"num_hidden_layers", layers},
                                              {"num_attention_heads", heads},
                                              {"num_key_value_heads", kv_heads},
                                              {"max_position_embeddings", 32768},
                                              {"rms_norm_eps", 1e-6},
                                              {"rope_theta", 1000000.0},
                                              {"tie_word_embeddings", false},
                                              {"bos_token_id", 1},
                                              {"eos_token_id", 2},
                                              {"torch_dtype", "bfloat16"},
                                              {"quantization_config",
                                               awq ? json::parse(R"({"quant_method": "awq", "bits": 4,
                                                   "group_size": 32, "zero_point": true, "version": "gemm",
                                                   "modules_to_not_convert": null})")
                                               : w8a8 ? json::parse(R"({"quant_method": "compressed-tensors",
                                                   "format": "int-quantized", "ignore": ["lm_head"],
                                                   "config_groups": {"group_0": {"targets": ["Linear"],
                                                   "weights": {"num_bits": 8, "type": "int", "symmetric": true,
                                                               "strategy": "channel"},
                                                   "input_activations": {"num_bits": 8, "type": "int",
                                                       "symmetric": true, "strategy": "token", "dynamic": true}}}})")
                                                    : json()}}
                                                 .dump();
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  SafetensorsWriter w;
  const auto add = [&](const std::string& name, std::vector<int64_t> shape, bool ones = false) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<uint8_t> bytes(static_cast<size_t>(n) * 2);
    for (int64_t i = 0; i < n; ++i) {
      const float v = ones ? 1.0f : normal(rng);
      uint32_t bits;
      std::memcpy(&bits, &v, 4);
      const uint16_t bf16 = static_cast<uint16_t>(bits >> 16);
      std::memcpy(&bytes[static_cast<size_t>(i) * 2], &bf16, 2);
    }
    if (w8a8 && name.ends_with("_proj.weight")) {  // codes in [-127, 127], scale 1/64 per row
      std::vector<uint8_t> codes(static_cast<size_t>(n));
      for (auto& c : codes) c = static_cast<uint8_t>(static_cast<int8_t>(static_cast<int>(rng() % 255) - 127));
      w.add_tensor(name, DType::kI8, shape, codes);
      std::vector<uint8_t> scales(static_cast<size_t>(shape[0]) * 2);
      for (size_t i = 0; i < scales.size(); i += 2) scales[i + 1] = 0x3c;  // bf16 0x3c80 = 1/64
      for (size_t i = 0; i < scales.size(); i += 2) scales[i] = 0x80;
      w.add_tensor(name.substr(0, name.size() - 6) + "weight_scale", DType::kBF16, {shape[0], 1}, scales);
      return;
    }
    if (awq && name.ends_with("_proj.weight")) {  // [in, out / 8] words; scales 1/64 (f16 0x2400)
      const int64_t out = shape[0], in = shape[1], groups = in / 32;
      const std::string base = name.substr(0, name.size() - 6);
      std::vector<uint8_t> qweight(static_cast<size_t>(in * out / 8 * 4)), qzeros(static_cast<size_t>(groups * out / 8 * 4));
      for (auto& b : qweight) b = static_cast<uint8_t>(rng());
      for (auto& b : qzeros) b = static_cast<uint8_t>(rng());
      std::vector<uint8_t> scales(static_cast<size_t>(groups * out * 2));
      for (size_t i = 0; i < scales.size(); i += 2) scales[i + 1] = 0x24;
      w.add_tensor(base + "qweight", DType::kI32, {in, out / 8}, qweight);
      w.add_tensor(base + "qzeros", DType::kI32, {groups, out / 8}, qzeros);
      w.add_tensor(base + "scales", DType::kF16, {groups, out}, scales);
      return;
    }
    w.add_tensor(name, DType::kBF16, shape, bytes);
  };
  add("model.embed_tokens.weight", {vocab, hidden});
  add("lm_head.weight", {vocab, hidden});
  add("model.norm.weight", {hidden}, true);
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {hidden}, true);
    add(p + "post_attention_layernorm.weight", {hidden}, true);
    add(p + "self_attn.q_proj.weight", {heads * head_dim, hidden});
    add(p + "self_attn.q_proj.bias", {heads * head_dim});
    add(p + "self_attn.k_proj.weight", {kv_heads * head_dim, hidden});
    add(p + "self_attn.k_proj.bias", {kv_heads * head_dim});
    add(p + "self_attn.v_proj.weight", {kv_heads * head_dim, hidden});
    add(p + "self_attn.v_proj.bias", {kv_heads * head_dim});
    add(p + "self_attn.o_proj.weight", {hidden, heads * head_dim});
    add(p + "mlp.gate_proj.weight", {inter, hidden});
    add(p + "mlp.up_proj.weight", {inter, hidden});
    add(p + "mlp.down_proj.weight", {hidden, inter});
  }
  EXPECT_TRUE(w.write(dir + "/model.safetensors").ok());
  return dir;
}

#define PAGODA_MODEL_FOLDER(var)                                                               \
  PAGODA_TEST_FILE(var##_tokenizer, "tokenizers/mistral-7b-v0.1/tokenizer.json");             \
  const std::string var = write_model_folder(std::filesystem::path(var##_tokenizer).parent_path().string())

// A compressed-tensors W8A8 checkpoint runs as vLLM runs one: detected from config.json, with or
// without --quantization compressed-tensors; a --quantization that contradicts it is refused
// naming both.
TEST(VllmCompat, CompressedTensorsW8A8CheckpointRuns) {
  PAGODA_TEST_FILE(tokenizer, "tokenizers/mistral-7b-v0.1/tokenizer.json");
  const std::string dir = write_model_folder(std::filesystem::path(tokenizer).parent_path().string(), "w8a8");
  for (const char* flag : {"", " --quantization compressed-tensors"}) {
    RunResult r = run_pagoda("generate --model " + shell_quote(dir) + " -p 'Hello there' -n 4 --ignore-eos -v" + flag);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("weights typed by the checkpoint at load (float ones converted, quantized ones as stored): "
                         "14 w8a8 (checkpoint)"),
              std::string::npos)
        << r.err;
    EXPECT_NE(r.err.find("generated tokens: 4,"), std::string::npos) << r.err;
  }
  RunResult other = run_pagoda("generate --model " + shell_quote(dir) + " -p hi -n 1 --quantization w8a8");
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_NE(other.err.find("(compressed-tensors, from its config.json) does not match --quantization w8a8"),
            std::string::npos)
      << other.err;
  PAGODA_MODEL_FOLDER(plain);
  RunResult missing = run_pagoda("generate --model " + shell_quote(plain) + " -p hi -n 1 --quantization compressed-tensors");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("declares no compressed-tensors quantization_config"), std::string::npos) << missing.err;
}

// pagoda quantize --type w8a8 / w4a8 on a Hugging Face folder writes the compressed-tensors
// folder llm-compressor would (config.json with quantization_config, I8 weights, weight_scale,
// the tokenizer files), and it computes exactly what --quantization w8a8 / w4a8 computes from the
// float folder at load: the same perplexity to the last digit.
TEST(VllmCompat, QuantizeWritesCompressedTensorsFolders) {
  PAGODA_MODEL_FOLDER(dir);
  const std::string out = testing::make_temp_dir();
  const std::string text = std::string(PAGODA_SOURCE_DIR) + "/tests/data/short-stories.txt";
  auto ppl = [&](const std::string& args, const std::string& name) {
    RunResult r = run_pagoda("perplexity -f " + shell_quote(text) + " --ctx 64 --chunks 4 --output-json " +
                             shell_quote(out + "/" + name) + " " + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(out + "/" + name);
    return json::parse(in)["ppl"].get<double>();
  };
  for (const char* type : {"w8a8", "w4a8"}) {
    const std::string folder = out + "/" + type;
    RunResult q = run_pagoda("quantize " + shell_quote(dir) + " " + shell_quote(folder) + " --type " + type);
    ASSERT_EQ(q.exit_code, 0) << q.err;
    EXPECT_NE(q.out.find("copied config.json and 2 tokenizer files"), std::string::npos) << q.out;
    std::ifstream cfg(folder + "/config.json");
    const json c = json::parse(cfg);
    EXPECT_EQ(c["quantization_config"]["format"], "int-quantized");
    EXPECT_EQ(c["model_type"], "qwen2");  // the input's config, kept
    EXPECT_TRUE(std::filesystem::is_regular_file(folder + "/tokenizer.json"));
    const double written = ppl("--model " + shell_quote(folder), std::string(type) + "-folder.json");
    const double online = ppl("--model " + shell_quote(dir) + " --quantization " + type, std::string(type) + "-load.json");
    EXPECT_EQ(written, online) << type;
    RunResult g = run_pagoda("generate --model " + shell_quote(folder) + " -p hi -n 2 --ignore-eos -v");
    EXPECT_EQ(g.exit_code, 0) << g.err;
    EXPECT_NE(g.err.find(std::string("14 ") + type), std::string::npos) << g.err;
  }
  std::filesystem::remove_all(out);
}

// The first serve line of the issue, verbatim but for the model folder and a free port: every
// flag is taken, the KV cache is sized by --gpu-memory-utilization, and the server answers.
TEST(VllmCompat, GuideServeCommandLineServes) {
  PAGODA_MODEL_FOLDER(dir);
  testing::ServerProcess server(
      PAGODA_BINARY, {dir, "--host", "127.0.0.1", "--max-model-len", "8192", "--gpu-memory-utilization", "0.85",
                      "--block-size", "32", "--enable-prefix-caching", "--max-num-batched-tokens", "4096",
                      "--max-num-seqs", "16", "--served-model-name", "qwen2-1.5b-optimized", "--enforce-eager",
                      "--log-level", "info"});
  ASSERT_NE(server.port(), 0) << server.log();
  EXPECT_EQ(testing::http_request(server.port(), "GET", "/health").status, 200);
  const testing::HttpResult models = testing::http_request(server.port(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200);
  const json m = json::parse(models.body);
  EXPECT_EQ(m["data"][0]["id"], "qwen2-1.5b-optimized");
  EXPECT_EQ(m["data"][0]["max_model_len"], 8192);
  const testing::HttpResult done = testing::http_request(
      server.port(), "POST", "/v1/completions",
      R"({"model": "qwen2-1.5b-optimized", "prompt": "Hello", "max_tokens": 4, "ignore_eos": true})");
  ASSERT_EQ(done.status, 200) << done.body;
  EXPECT_EQ(json::parse(done.body)["usage"]["completion_tokens"], 4);
  const std::string log = server.log();
  EXPECT_NE(log.find("blocks of 32 tokens"), std::string::npos) << log;
  EXPECT_NE(log.find("sized by --gpu-memory-utilization 0.85 of the machine's"), std::string::npos) << log;
}

// `make run`'s model (demo-random, with the byte tokenizer) has a chat template of its own, so chat
// works out of the box: a user turn renders as "<|user|>\nHi\n" after BOS, an assistant turn
// ends in EOS, and the generation prompt opens the assistant's turn.
TEST(VllmCompat, TheDefaultModelServesChat) {
  testing::ServerProcess server(PAGODA_BINARY, {"demo-random"});
  ASSERT_NE(server.port(), 0) << server.log();
  const auto rendered = [&](const std::string& messages) {
    const testing::HttpResult r = testing::http_request(
        server.port(), "POST", "/tokenize", R"({"messages": )" + messages + R"(, "add_generation_prompt": true})");
    EXPECT_EQ(r.status, 200) << r.body;
    std::string text;  // the byte tokenizer's ids: 0-255 the bytes, 256 BOS, 257 EOS
    const json body = json::parse(r.body);
    for (const json& id : body["tokens"]) {
      const int v = id.get<int>();
      text += v == 256 ? std::string("<s>") : v == 257 ? std::string("</s>") : std::string(1, static_cast<char>(v));
    }
    return text;
  };
  EXPECT_EQ(rendered(R"([{"role": "user", "content": "Hi"}])"), "<s><|user|>\nHi\n<|assistant|>\n");
  EXPECT_EQ(rendered(R"([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                         {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "Bye"}])"),
            "<s><|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello</s>\n<|user|>\nBye\n<|assistant|>\n");
  const testing::HttpResult chat = testing::http_request(
      server.port(), "POST", "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "ignore_eos": true})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  const json c = json::parse(chat.body);
  EXPECT_EQ(c["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(c["usage"]["prompt_tokens"], 1 + std::string("<|user|>\nHi\n<|assistant|>\n").size());
  EXPECT_EQ(c["usage"]["completion_tokens"], 4);
  EXPECT_EQ(server.log().find("no chat template"), std::string::npos) << server.log();
}

// The second line asks for AWQ: an AutoAWQ folder serves with it (its projections read as int4
// codes with zero points), and a folder that is not AWQ is refused in one line naming the flag,
// before the port is taken.
TEST(VllmCompat, QuantizedServeCommandLineServesAwq) {
  PAGODA_TEST_FILE(tokenizer, "tokenizers/mistral-7b-v0.1/tokenizer.json");
  const std::string dir = write_model_folder(std::filesystem::path(tokenizer).parent_path().string(), "awq");
  testing::ServerProcess server(
      PAGODA_BINARY, {dir, "--host", "127.0.0.1", "--quantization", "awq", "--max-model-len", "8192",
                      "--gpu-memory-utilization", "0.9", "--served-model-name", "qwen2-1.5b-quantized",
                      "--log-level", "info"});
  ASSERT_NE(server.port(), 0) << server.log();
  const testing::HttpResult done = testing::http_request(
      server.port(), "POST", "/v1/completions",
      R"({"model": "qwen2-1.5b-quantized", "prompt": "Hello", "max_tokens": 4, "ignore_eos": true})");
  ASSERT_EQ(done.status, 200) << done.body;
  EXPECT_EQ(json::parse(done.body)["usage"]["completion_tokens"], 4);
  EXPECT_NE(server.log().find("14 awq int4 g32 (checkpoint)"), std::string::npos) << server.log();

  PAGODA_MODEL_FOLDER(plain);
  const auto start = std::chrono::steady_clock::now();
  RunResult r = run_pagoda("serve " + shell_quote(plain) +
                           " --port 8002 --quantization awq --max-model-len 8192 --gpu-memory-utilization 0.9 "
                           "--served-model-name qwen2-1.5b-quantized");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("--quantization awq: " + plain + " declares no awq quantization_config"), std::string::npos)
      << r.err;
  EXPECT_LT(seconds, 2.0);
  RunResult other = run_pagoda("generate --model " + shell_quote(dir) + " -p hi -n 1 --quantization gptq");
  EXPECT_EQ(other.exit_code, 1);
  EXPECT_NE(other.err.find("(awq, from its config.json) does not match --quantization gptq"), std::string::npos)
      << other.err;
  RunResult marlin = run_pagoda("generate --model " + shell_quote(dir) + " -p hi -n 2 --ignore-eos -q awq_marlin");
  EXPECT_EQ(marlin.exit_code, 0) << marlin.err;
}

// vLLM flags for capabilities Pagoda lacks fail at once naming the flag; flags with no meaning
// here are accepted and the run goes on.
TEST(VllmCompat, UnsupportedValuesFailAcceptedFlagsPass) {
  const std::pair<const char*, const char*> refused[] = {
      {"-tp 0", "--tensor-parallel-size must be in [1, 64], got 0"},
      {"--tensor-parallel-size=65", "--tensor-parallel-size must be in [1, 64], got 65"},
      {"-tp 2 --distributed-executor-backend ray", "--distributed-executor-backend ray"},
      {"-pp 0", "--pipeline-parallel-size must be at least 1"},
      {"-tp 8 -pp 9", "at most 64 ranks, got 9"},
      {"-dp 0", "--data-parallel-size must be at least 1"},
      {"-dp 2 -tp 8 -pp 8", "at most 64 ranks, got 2"},
      {"--distributed-timeout-seconds 0", "--distributed-timeout-seconds must be in (0, 86400]"},
      {"--kv-cache-dtype fp8_inc", "--kv-cache-dtype fp8_inc"},
      {"--quantization gptq", "--quantization gptq"},
      {"-q fp8", "--quantization fp8"},
      {"--tokenizer-mode mistral", "--tokenizer-mode mistral"},
      {"--log-level loud", "--log-level"},
      {"--gpu-memory-utilization 1.5", "--gpu-memory-utilization"},
      {"--kv-cache-memory-bytes lots", "--kv-cache-memory-bytes"},
  };
  for (const auto& [args, named] : refused) {
    for (const char* cmd : {"serve demo-random --port 0 ", "generate --model demo-random -p hi "}) {
      RunResult r = run_pagoda(std::string(cmd) + args);
      EXPECT_EQ(r.exit_code, 1) << cmd << args;
      EXPECT_EQ(count_lines(r.err), 1) << r.err;
      EXPECT_NE(r.err.find(named), std::string::npos) << cmd << args << ": " << r.err;
    }
  }
  // Data-parallel replicas are the server's: the one-engine commands say so.
  RunResult replicas = run_pagoda("generate --model demo-random -p hi -dp 2");
  EXPECT_EQ(replicas.exit_code, 1);
  EXPECT_NE(replicas.err.find("--data-parallel-size 2: pagoda generate runs one engine"), std::string::npos)
      << replicas.err;
  RunResult ok = run_pagoda(
      "generate --model demo-random -p hi -n 3 --ignore-eos --enforce-eager --swap-space 8 --trust-remote-code "
      "--max-seq-len-to-capture 4096 --revision main --download-dir /nonexistent -tp 1 -pp 1 -dp 1 "
      "--distributed-executor-backend uni "
      "--tokenizer-mode slow --kv-cache-dtype auto --quantization none --seed 3 --enable-chunked-prefill "
      "--kv-cache-memory-bytes 64MiB");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  EXPECT_NE(ok.err.find("--revision main has no effect"), std::string::npos) << ok.err;
  EXPECT_NE(ok.err.find("generated tokens: 3"), std::string::npos) << ok.err;
}

// --gpu-memory-utilization: the KV cache gets what the fraction leaves after weights and
// activations; too little is a clear error saying what used the memory.
TEST(VllmCompat, GpuMemoryUtilizationSizesTheKvCache) {
  PAGODA_MODEL_FOLDER(dir);
  RunResult tiny = run_pagoda("generate --model " + shell_quote(dir) + " -p hi -n 1 --gpu-memory-utilization 0.000001");
  EXPECT_EQ(tiny.exit_code, 1);
  EXPECT_NE(tiny.err.find("--gpu-memory-utilization 1e-06 leaves 0.00 GiB for the KV cache"), std::string::npos)
      << tiny.err;
  EXPECT_NE(tiny.err.find("of weights"), std::string::npos) << tiny.err;
  RunResult sized = run_pagoda("generate --model " + shell_quote(dir) +
                               " -p hi -n 1 --gpu-memory-utilization 0.05 --max-model-len 1024 -v");
  EXPECT_EQ(sized.exit_code, 0) << sized.err;
  EXPECT_NE(sized.err.find("sized by --gpu-memory-utilization 0.05 of the machine's"), std::string::npos) << sized.err;
  // --kv-cache-memory-bytes wins over the fraction.
  RunResult bytes = run_pagoda("generate --model " + shell_quote(dir) +
                               " -p hi -n 1 --gpu-memory-utilization 0.05 --kv-cache-memory-bytes 16MiB "
                               "--max-model-len 1024 -v");
  EXPECT_EQ(bytes.exit_code, 0) << bytes.err;
  EXPECT_NE(bytes.err.find("sized by --kv-cache-memory-bytes"), std::string::npos) << bytes.err;
  EXPECT_NE(bytes.err.find("KV cache: 2048 blocks of 16 tokens (float32, 8192 bytes each)"), std::string::npos) << bytes.err;
  // --kv-cache-dtype: the same memory holds 4x the tokens in fp8, a little under 4x in int8 (a
  // float scale per token and head: 64-wide heads, 64 + 4 bytes against 256).
  RunResult fp8 = run_pagoda("generate --model " + shell_quote(dir) +
                             " -p hi -n 1 --kv-cache-memory-bytes 16MiB --kv-cache-dtype fp8 --max-model-len 1024 -v");
  EXPECT_EQ(fp8.exit_code, 0) << fp8.err;
  EXPECT_NE(fp8.err.find("KV cache: 8192 blocks of 16 tokens (fp8_e4m3, 2048 bytes each, 4.00x the tokens of a float32 cache)"),
            std::string::npos)
      << fp8.err;
}

// --generation-config auto (the default): the folder's generation_config.json gives the request
// defaults (here greedy, at most 5 tokens); vllm keeps the engine's own (temperature 1, so two
// seeds sample differently); a bad file is an error naming it.
TEST(VllmCompat, GenerationConfigGivesRequestDefaults) {
  PAGODA_MODEL_FOLDER(dir);
  std::ofstream(dir + "/generation_config.json") << R"({"temperature": 0.0, "top_p": 0.9, "max_new_tokens": 5})";
  const std::string base = "generate --model " + shell_quote(dir) + " -p 'Hello there' -n 12 --ignore-eos ";
  RunResult a = run_pagoda(base + "--seed 1");
  RunResult b = run_pagoda(base + "--seed 2");
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);  // greedy: the seed does not matter
  EXPECT_NE(a.err.find("generated tokens: 5,"), std::string::npos) << a.err;  // capped at max_new_tokens
  EXPECT_NE(a.err.find("request defaults from generation_config.json"), std::string::npos) << a.err;
  RunResult c = run_pagoda(base + "--seed 1 --generation-config vllm");
  RunResult d = run_pagoda(base + "--seed 2 --generation-config vllm");
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_NE(c.out, d.out);  // temperature 1 over 32000 random logits
  EXPECT_NE(c.err.find("generated tokens: 12,"), std::string::npos) << c.err;
  // An explicit temperature beats the file's default.
  RunResult e = run_pagoda(base + "--seed 1 -t 1");
  RunResult f = run_pagoda(base + "--seed 2 -t 1");
  EXPECT_NE(e.out, f.out);
  // --log-level warning hides the INFO line.
  RunResult quiet = run_pagoda(base + "--log-level warning");
  EXPECT_EQ(quiet.err.find("INFO"), std::string::npos) << quiet.err;
  // A folder given explicitly must hold the file; a bad field names the file.
  RunResult missing = run_pagoda(base + "--generation-config " + shell_quote(testing::make_temp_dir()));
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("no generation_config.json"), std::string::npos) << missing.err;
  std::ofstream(dir + "/generation_config.json") << R"({"temperature": "hot"})";
  RunResult bad = run_pagoda(base);
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("generation_config.json: 'temperature' must be a number"), std::string::npos) << bad.err;
  std::ofstream(dir + "/generation_config.json") << R"({"top_p": 1.5})";
  RunResult range = run_pagoda(base);
  EXPECT_NE(range.err.find("generation_config.json: top_p must be in (0, 1]"), std::string::npos) << range.err;
}

TEST(VllmCompat, VersionAndHelpGroups) {
  RunResult v = run_pagoda("--version");
  EXPECT_EQ(v.exit_code, 0);
  // MAJOR.MINOR.PATCH and a newline, nothing else.
  int dots = 0;
  bool digits_only = !v.out.empty() && v.out.back() == '\n';
  for (size_t i = 0; i + 1 < v.out.size(); ++i) {
    if (v.out[i] == '.') {
      ++dots;
    } else if (v.out[i] < '0' || v.out[i] > '9') {
      digits_only = false;
    }
  }
  EXPECT_TRUE(digits_only && dots == 2) << v.out;
  RunResult groups = run_pagoda("serve --help=listgroup");
  EXPECT_EQ(groups.exit_code, 0);
  for (const char* g : {"ModelConfig", "LoadConfig", "CacheConfig", "ParallelConfig", "SchedulerConfig", "Frontend"}) {
    EXPECT_NE(groups.out.find(g), std::string::npos) << g << "\n" << groups.out;
  }
  RunResult cache = run_pagoda("serve --help=CacheConfig");
  EXPECT_EQ(cache.exit_code, 0);
  EXPECT_NE(cache.out.find("--gpu-memory-utilization"), std::string::npos) << cache.out;
  EXPECT_NE(cache.out.find("--kv-cache-memory-bytes"), std::string::npos) << cache.out;
  EXPECT_EQ(cache.out.find("  --max-num-seqs INT"), std::string::npos) << cache.out;
  EXPECT_EQ(cache.out.find("  --port"), std::string::npos) << cache.out;
  RunResult word = run_pagoda("serve --help=prefix");
  EXPECT_NE(word.out.find("--enable-prefix-caching"), std::string::npos) << word.out;
  EXPECT_EQ(word.out.find("  --block-size"), std::string::npos) << word.out;
  RunResult all = run_pagoda("serve --help");
  for (const char* g : {"ModelConfig:", "CacheConfig:", "SchedulerConfig:", "Frontend:"}) {
    EXPECT_NE(all.out.find(g), std::string::npos) << g;
  }
  EXPECT_EQ(run_pagoda("serve --help=NoSuchGroup").exit_code, 2);
}

// Without chunked prefill a prompt runs whole, so the token budget must hold --max-model-len;
// the greedy text is the same as with chunks of 16 tokens.
TEST(VllmCompat, NoChunkedPrefillGivesTheSameText) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const std::string base = "generate --model " + shell_quote(model) +
                           " -p 'Once upon a time there was a little girl named Lily who loved to play' -n 24 -t 0 ";
  RunResult too_small = run_pagoda(base + "--no-enable-chunked-prefill --max-num-batched-tokens 64");
  EXPECT_EQ(too_small.exit_code, 1);
  EXPECT_NE(too_small.err.find("--max-num-batched-tokens (64) is smaller than --max-model-len (2048)"),
            std::string::npos)
      << too_small.err;
  RunResult whole = run_pagoda(base + "--no-enable-chunked-prefill --max-num-batched-tokens 64 --max-model-len 64");
  RunResult chunked = run_pagoda(base + "--max-num-batched-tokens 16 --max-model-len 64");
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  ASSERT_EQ(chunked.exit_code, 0) << chunked.err;
  EXPECT_FALSE(whole.out.empty());
  EXPECT_EQ(whole.out, chunked.out);
}

// The tokenizer and the chat template are checked before any weight is read or generated: a
// 1.1B dummy model would take many seconds to make.
TEST(VllmCompat, ServeFailsFastBeforeTheWeights) {
  PAGODA_TEST_FILE(vocab, "vocab/ggml-vocab-llama-spm.gguf");
  for (const std::string& args :
       {std::string("serve tinyllama-1.1b --load-format dummy --port 0"),
        "serve tinyllama-1.1b --load-format dummy --port 0 --tokenizer " + shell_quote(vocab) +
            " --chat-template '{% if %}'"}) {
    const auto start = std::chrono::steady_clock::now();
    RunResult r = run_pagoda(args);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(r.exit_code, 1) << args;
    EXPECT_NE(r.err.find("pagoda: error:"), std::string::npos) << r.err;
    EXPECT_LT(seconds, 1.0) << args << ": " << r.err;
  }
}

// `pagoda generate --input-file` reads each line with the server's parser: the same defaults,
// the same empty-prompt rule, the same refusals, unknown fields warned about once, and logprobs
// in the completions shape (prompt_logprobs in vLLM's).
TEST(VllmCompat, OfflineBatchFollowsTheServersRules) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(golden_path, "stories260K/greedy-bos-256.txt");
  std::ifstream golden_in(golden_path);
  const std::string golden((std::istreambuf_iterator<char>(golden_in)), std::istreambuf_iterator<char>());
  const std::string dir = testing::make_temp_dir();
  const std::string in = dir + "/in.jsonl", out = dir + "/out.jsonl";
  std::ofstream(in) << R"({"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "logprobs": 2, "prompt_logprobs": 1})"
                    << "\n"
                    << R"({"prompt": "", "max_tokens": 6, "temperature": 0, "frobnicate": 1})" << "\n"
                    << R"({"prompt": ["Tom", "Sue"], "max_tokens": 2, "frobnicate": 2, "n": 2})" << "\n";
  RunResult r = run_pagoda("generate --model " + shell_quote(model) + " --input-file " + shell_quote(in) +
                           " --output-file " + shell_quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("'frobnicate'"), r.err.rfind("'frobnicate'")) << "warned once: " << r.err;
  EXPECT_NE(r.err.find("ignoring the unknown request field 'frobnicate'"), std::string::npos) << r.err;
  std::ifstream results(out);
  std::vector<json> lines;
  for (std::string line; std::getline(results, line);) lines.push_back(json::parse(line));
  ASSERT_EQ(lines.size(), 3u);

  const json& first = lines[0];
  ASSERT_TRUE(first.contains("logprobs")) << first.dump();
  const json& lp = first["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 4u);
  ASSERT_EQ(lp["token_logprobs"].size(), 4u);
  ASSERT_EQ(lp["text_offset"].size(), 4u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  for (size_t i = 0; i < 4; ++i) {
    const double chosen = lp["token_logprobs"][i].get<double>();
    EXPECT_LE(chosen, 0.0);
    const json& top = lp["top_logprobs"][i];
    EXPECT_GE(top.size(), 2u);
    EXPECT_LE(top.size(), 3u);
    double best = -1e9;
    for (const auto& [_, v] : top.items()) best = std::max(best, v.get<double>());
    EXPECT_DOUBLE_EQ(chosen, best) << "greedy picks the most likely token";
  }
  const json& pl = first["prompt_logprobs"];
  ASSERT_EQ(pl.size(), first["usage"]["prompt_tokens"].get<size_t>());
  EXPECT_TRUE(pl[0].is_null());
  for (size_t i = 1; i < pl.size(); ++i) EXPECT_GE(pl[i].size(), 1u);

  // An empty prompt is [BOS] here, as in the server: the golden greedy text from BOS.
  EXPECT_EQ(lines[1]["usage"]["prompt_tokens"], 1);
  const std::string empty_text = lines[1]["text"].get<std::string>();
  EXPECT_FALSE(empty_text.empty());
  EXPECT_EQ(golden.rfind(empty_text, 0), 0u) << empty_text;
  EXPECT_FALSE(lines[1].contains("logprobs"));

  // A list of prompts times n: four choices, all under "outputs".
  EXPECT_EQ(lines[2]["outputs"].size(), 4u);
  EXPECT_EQ(lines[2]["usage"]["completion_tokens"], 8);

  // Fields that would change the result are refused by name, as the server refuses them; a
  // structured output's unsupported keyword too.
  std::ofstream(in) << R"({"prompt": "a", "guided_json": {"type": "integer", "multipleOf": 2}})" << "\n";
  RunResult refused = run_pagoda("generate --model " + shell_quote(model) + " --input-file " + shell_quote(in));
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_NE(refused.err.find(in + ":1: guided_json: JSON schema: at #: 'multipleOf' is not supported"),
            std::string::npos)
      << refused.err;
  std::ofstream(in) << R"({"prompt": "a", "use_beam_search": true})" << "\n";
  RunResult beam = run_pagoda("generate --model " + shell_quote(model) + " --input-file " + shell_quote(in));
  EXPECT_EQ(beam.exit_code, 1);
  EXPECT_NE(beam.err.find(in + ":1: use_beam_search (beam search) is not supported"), std::string::npos) << beam.err;
  // No tokens at all is refused in the CLI and in the server alike.
  RunResult none = run_pagoda("generate --model " + shell_quote(model) + " -p '' --no-add-special");
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("the prompt must give at least one token"), std::string::npos) << none.err;
  testing::ServerProcess server(PAGODA_BINARY, {model});
  ASSERT_NE(server.port(), 0);
  const testing::HttpResult empty = testing::http_request(
      server.port(), "POST", "/v1/completions", R"({"prompt": "", "max_tokens": 6, "temperature": 0})");
  ASSERT_EQ(empty.status, 200) << empty.body;
  EXPECT_EQ(json::parse(empty.body)["choices"][0]["text"], empty_text);
  const testing::HttpResult no_tokens = testing::http_request(
      server.port(), "POST", "/v1/completions", R"({"prompt": "", "add_special_tokens": false})");
  EXPECT_EQ(no_tokens.status, 400);
  EXPECT_NE(no_tokens.body.find("the prompt must give at least one token"), std::string::npos) << no_tokens.body;
}

}  // namespace
}  // namespace pagoda
