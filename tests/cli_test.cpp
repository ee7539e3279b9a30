// The pagoda binary as a user runs it: stdout holds only the generated text or the JSON ids,
// stderr one summary or error line, and the exit status says which.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <map>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/gguf_file.h"
#include "loader/model_source.h"
#include "support/cli_run.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

using testing::RunResult;

RunResult run_pagoda(const std::string& args, const std::string& env = "") {
  return testing::run_binary(PAGODA_BINARY, args, env);
}

std::string quote(const std::string& s) { return testing::shell_quote(s); }

using testing::count_lines;

TEST(Cli, GenerateStories260KGoldenText) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  RunResult r = run_pagoda("generate --model " + quote(model) +
                           " --prompt '' --max-tokens 256 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(txt);
  std::string want((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  want.pop_back();  // the file's final newline
  EXPECT_EQ(r.out, want);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find("prompt tokens: 1, generated tokens: 256"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos);
}

// stories260K's golden greedy text (the file without its final newline), and the generate
// command that should print it.
std::string golden_text(const std::string& txt) {
  std::ifstream in(txt);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.pop_back();
  return text;
}
std::string greedy_256_args(const std::string& model) {
  return "generate --model " + quote(model) + " --prompt '' --max-tokens 256 --temperature 0";
}

// The golden text through the scalar kernels on one thread and the best kernels on three, the
// verbose log naming the kernels picked; bad PAGODA_CPU_ISA and --threads values are refused.
TEST(Cli, GoldenTextWithEveryKernelTableAndThreadCount) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const std::string want = golden_text(txt);
  const std::string args = greedy_256_args(model);
  for (auto [env, threads] : {std::pair{"PAGODA_CPU_ISA=scalar", 1}, std::pair{"PAGODA_CPU_ISA=auto", 3}}) {
    RunResult r = run_pagoda(args + " -v --threads " + std::to_string(threads), env);
    ASSERT_EQ(r.exit_code, 0) << env << ": " << r.err;
    EXPECT_EQ(r.out, want) << env << " --threads " << threads;
    EXPECT_NE(r.err.find(threads == 1 ? "cpu: reference kernels" : " on 3 threads; "), std::string::npos) << r.err;
  }
  RunResult bad_isa = run_pagoda(args, "PAGODA_CPU_ISA=avx1024");
  EXPECT_NE(bad_isa.exit_code, 0);
  EXPECT_NE(bad_isa.err.find("PAGODA_CPU_ISA"), std::string::npos) << bad_isa.err;
  RunResult bad_threads = run_pagoda(args + " --threads 0");
  EXPECT_NE(bad_threads.exit_code, 0);
  EXPECT_NE(bad_threads.err.find("--threads"), std::string::npos) << bad_threads.err;
}

// vLLM's --hf-overrides, --rope-scaling and --rope-theta on a GGUF file: stories260K's context
// (2,048) stretched by linear scaling takes --max-model-len 8192, which it refuses unscaled; the
// two spellings of one scaling give the same text, and it is not the unscaled text (positions are
// divided by 4); the file's own theta keeps the golden text and another does not; a field that
// cannot be overridden, or a bad value, is refused before anything loads.
TEST(Cli, RopeScalingFlagsAndHfOverridesStretchTheContext) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const std::string args = greedy_256_args(model);
  RunResult unscaled = run_pagoda(args + " --max-model-len 8192");
  EXPECT_NE(unscaled.exit_code, 0);
  EXPECT_NE(unscaled.err.find("--max-model-len must be in [1, 2048]"), std::string::npos) << unscaled.err;
  RunResult overrides =
      run_pagoda(args + " --max-model-len 8192 --hf-overrides " + quote(R"({"rope_scaling": {"rope_type": "linear", "factor": 4}})"));
  ASSERT_EQ(overrides.exit_code, 0) << overrides.err;
  RunResult flag = run_pagoda(args + " --max-model-len 8192 --rope-scaling " + quote(R"({"type": "linear", "factor": 4.0})"));
  ASSERT_EQ(flag.exit_code, 0) << flag.err;
  EXPECT_EQ(overrides.out, flag.out);
  EXPECT_NE(overrides.out, golden_text(txt));
  RunResult own_theta = run_pagoda(args + " --rope-theta 10000");
  ASSERT_EQ(own_theta.exit_code, 0) << own_theta.err;
  EXPECT_EQ(own_theta.out, golden_text(txt));
  RunResult other_theta = run_pagoda(args + " --rope-theta 20000");
  ASSERT_EQ(other_theta.exit_code, 0) << other_theta.err;
  EXPECT_NE(other_theta.out, golden_text(txt));
  const std::vector<std::pair<std::string, std::string>> refused = {
      {" --hf-overrides " + quote(R"({"num_hidden_layers": 2})"), "num_hidden_layers"},
      {" --rope-theta -1", "--rope-theta"},
      {" --rope-scaling " + quote(R"({"rope_type": "longrope", "factor": 2})"), "longrope"},
      {" --rope-scaling " + quote(R"({"type": "linear", "factor": 2}, "rope_theta": 5)"), "--rope-scaling"},
      {" --hf-overrides " + quote("{"), "--hf-overrides"}};
  for (const auto& [bad, named] : refused) {
    RunResult r = run_pagoda(args + bad);
    EXPECT_NE(r.exit_code, 0) << bad;
    EXPECT_TRUE(r.out.empty()) << bad;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
    EXPECT_NE(r.err.find(named), std::string::npos) << r.err;
  }
}

// A 32k-token sequence of a TinyLlama-shaped model in a KV budget of 512 MiB: with an 8-bit KV
// cache (fp8, as int8: 2 x 22 layers x 4 KV heads x 64 bytes a token, 369 MB at 32k) it fits and
// runs; float32 (1.48 GB) does not, and start-up says so.
TEST(Cli, A32kSequenceFitsA512MiBBudgetWithAnEightBitKvCache) {
  PAGODA_TEST_FILE(vocab, "vocab/ggml-vocab-llama-spm.gguf");
  const std::string args =
      "generate --model tinyllama-1.1b --tokenizer " + quote(vocab) +
      " --load-format dummy --dtype q4_0 --max-model-len 32768 "
      "--hf-overrides '{\"max_position_embeddings\": 32768}' --kv-cache-memory-bytes 512MiB --prompt Hello "
      "--max-tokens 2 --temperature 0 -v";
  RunResult fp8 = run_pagoda(args + " --kv-cache-dtype fp8");
  ASSERT_EQ(fp8.exit_code, 0) << fp8.err;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(fp8.err, m, std::regex("up to ([0-9]+) tokens at once"))) << fp8.err;
  EXPECT_GE(std::stoll(m[1]), 32768);
  RunResult f32 = run_pagoda(args + " --kv-cache-dtype float32");
  EXPECT_NE(f32.exit_code, 0);
  EXPECT_NE(f32.err.find("cannot hold one sequence of --max-model-len 32768"), std::string::npos) << f32.err;
}

// Where stdout and stderr meet (`2>&1`, as a terminal shows them), the stats line starts a line of
// its own; stdout alone still holds the text exactly (the golden tests above).
TEST(Cli, TheStatsLineStartsALineOfItsOwnAfterTheText) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  RunResult r = testing::run_binary("sh", "-c " + quote(std::string(PAGODA_BINARY) + " " + greedy_256_args(model) + " 2>&1"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_EQ(r.out.rfind(golden_text(txt) + "\nprompt tokens: 1, generated tokens: 256", 0), 0u) << r.out;
}

// One process named CPUs (--cpu-affinity, or vLLM's VLLM_CPU_OMP_THREADS_BIND) is pinned to them
// before its thread pool starts, which then has one thread per pinned core; a bad list is refused.
TEST(Cli, OneProcessIsPinnedToTheCpusItIsGiven) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const std::string args = greedy_256_args(model) + " -v";
  for (auto [flag, env] : {std::pair{" --cpu-affinity 0", ""}, std::pair{"", "VLLM_CPU_OMP_THREADS_BIND=0"}}) {
    RunResult r = run_pagoda(args + flag, env);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, golden_text(txt));
    EXPECT_NE(r.err.find("pinned to CPUs 0"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find(" on 1 threads; "), std::string::npos) << r.err;
  }
  RunResult all = run_pagoda(args, "VLLM_CPU_OMP_THREADS_BIND=all");
  ASSERT_EQ(all.exit_code, 0) << all.err;
  EXPECT_EQ(all.err.find("pinned to"), std::string::npos) << all.err;
  RunResult bad = run_pagoda(args + " --cpu-affinity 0-x");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("--cpu-affinity: '0-x' is not a CPU or a range of CPUs"), std::string::npos) << bad.err;
}

// Tensor parallelism on ranks forked on this host (--tensor-parallel-size, vLLM's -tp):
// stories260K's 8 heads, 4 KV heads (one per rank at 4), feed-forward of 172 and vocabulary of 512
// split over 2 and 4 ranks give the golden greedy text; a batch of probes (greedy, seeded
// sampling with n = 2 and penalties, stops, several prompts in one batch) gives at 2 ranks, with
// q8_0 weights too, the tokens one process gives, and logprobs within rounding: f32 ones equal to
// 1e-5, q8_0 ones to 0.1 (measured 0.064: where the all-reduce's rounding-level change straddles
// an int8 rounding step of the activations, a whole step moves). A size that does not divide the
// heads fails naming them; a backend that runs one process cannot take more ranks.
TEST(Cli, TensorParallelKeepsTheGoldenTextAndTheProbes) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  for (const char* tp : {"2", "4"}) {
    RunResult r = run_pagoda(greedy_256_args(model) + " --tensor-parallel-size " + tp);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, golden_text(txt)) << "-tp " << tp;
    EXPECT_NE(r.err.find("--tensor-parallel-size " + std::string(tp) + " x --pipeline-parallel-size 1: " + tp +
                         " ranks on this host"),
              std::string::npos)
        << r.err;
  }
  const std::string dir = pagoda::testing::make_temp_dir() + "/";
  const std::string in = dir + "probes.jsonl";
  std::ofstream(in) << "{\"prompt\": \"Once upon a time\", \"max_tokens\": 40, \"temperature\": 0}\n"
                    << "{\"prompt\": \"Lily had a dog\", \"n\": 2, \"temperature\": 1.0, \"seed\": 3, "
                       "\"presence_penalty\": 0.5, \"max_tokens\": 40}\n"
                    << "{\"prompt\": \"Tom saw\", \"stop\": [\".\"], \"max_tokens\": 60, \"temperature\": 0}\n"
                    << "{\"prompt\": \"The sun\", \"temperature\": 0.8, \"top_p\": 0.9, \"seed\": 11, "
                       "\"max_tokens\": 50, \"logprobs\": 2}\n";
  for (auto [dtype, tol] : {std::pair{"auto", 1e-5}, std::pair{"q8_0", 0.1}}) {
    std::vector<nlohmann::json> outputs[2];
    for (int i = 0; i < 2; ++i) {
      const std::string out = dir + "out" + std::to_string(i) + ".jsonl";
      RunResult r = run_pagoda("generate --model " + quote(model) + " --input-file " + quote(in) + " --output-file " +
                               quote(out) + " --dtype " + dtype + " --tensor-parallel-size " + (i == 0 ? "1" : "2"));
      ASSERT_EQ(r.exit_code, 0) << r.err;
      std::ifstream file(out);
      for (std::string line; std::getline(file, line);) outputs[i].push_back(nlohmann::json::parse(line));
    }
    ASSERT_EQ(outputs[0].size(), 4u);
    ASSERT_EQ(outputs[1].size(), 4u);
    for (size_t p = 0; p < 4; ++p) {
      nlohmann::json one = outputs[0][p], two = outputs[1][p];
      // A result is one object, or a list of n of them.
      if (!one.is_array()) one = nlohmann::json::array({one}), two = nlohmann::json::array({two});
      ASSERT_EQ(one.size(), two.size()) << dtype << " probe " << p;
      for (size_t c = 0; c < one.size(); ++c) {
        EXPECT_EQ(two[c]["token_ids"], one[c]["token_ids"]) << dtype << " probe " << p;
        EXPECT_EQ(two[c]["text"], one[c]["text"]);
        EXPECT_EQ(two[c]["finish_reason"], one[c]["finish_reason"]);
        if (!one[c].contains("logprobs")) continue;
        const auto& a = one[c]["logprobs"]["token_logprobs"];
        const auto& b = two[c]["logprobs"]["token_logprobs"];
        ASSERT_EQ(a.size(), b.size());
        for (size_t t = 0; t < a.size(); ++t) {
          EXPECT_NEAR(b[t].get<double>(), a[t].get<double>(), tol) << dtype << " probe " << p << " token " << t;
        }
      }
    }
  }
  RunResult three = run_pagoda(greedy_256_args(model) + " -tp 3");
  EXPECT_EQ(three.exit_code, 1);
  EXPECT_NE(three.err.find("--tensor-parallel-size 3 does not divide the attention heads (8)"), std::string::npos)
      << three.err;
  RunResult uni = run_pagoda(greedy_256_args(model) + " -tp 2 --distributed-executor-backend uni");
  EXPECT_EQ(uni.exit_code, 1);
  EXPECT_NE(uni.err.find("--distributed-executor-backend uni runs one process"), std::string::npos) << uni.err;
  RunResult affinity = run_pagoda(greedy_256_args(model) + " -tp 2 --cpu-affinity '0-1'");
  EXPECT_EQ(affinity.exit_code, 1);
  EXPECT_NE(affinity.err.find("names CPUs for 1 ranks, but there are 2"), std::string::npos) << affinity.err;
}

// Pipeline parallelism: stories260K's 5 layers in 2 stages (2 + 3), alone and with 2
// tensor-parallel ranks per stage (4 ranks), give the golden text; the probes (a batch of
// sequences, several steps in flight) give exactly the one-process tokens and log-probabilities
// (a pipeline reorders no sum) in 2 stages, and the same tokens in 2 x 2. More stages than layers
// are refused.
TEST(Cli, PipelineParallelKeepsTheGoldenTextAndTheProbes) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  for (const char* sizes : {"-pp 2", "-pp 2 -tp 2"}) {
    RunResult r = run_pagoda(greedy_256_args(model) + " " + sizes);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, golden_text(txt)) << sizes;
  }
  const std::string dir = pagoda::testing::make_temp_dir() + "/";
  const std::string in = dir + "probes.jsonl";
  std::ofstream(in) << "{\"prompt\": \"Once upon a time\", \"max_tokens\": 40, \"temperature\": 0}\n"
                    << "{\"prompt\": \"Lily had a dog\", \"n\": 3, \"temperature\": 1.0, \"seed\": 3, "
                       "\"presence_penalty\": 0.5, \"max_tokens\": 40}\n"
                    << "{\"prompt\": \"Tom saw\", \"stop\": [\".\"], \"max_tokens\": 60, \"temperature\": 0}\n"
                    << "{\"prompt\": \"The sun\", \"temperature\": 0.8, \"top_p\": 0.9, \"seed\": 11, "
                       "\"max_tokens\": 50, \"logprobs\": 2}\n"
                    // A structured output: its masks travel to every rank with the step.
                    << "{\"prompt\": \"Once upon a time\", \"temperature\": 1.0, \"seed\": 5, \"max_tokens\": 40, "
                       "\"structured_outputs\": {\"regex\": \" [a-z]+( [a-z]+){2,8}\\\\.\"}}\n";
  std::vector<nlohmann::json> outputs[3];
  const char* sizes[] = {"-pp 1", "-pp 2", "-pp 2 -tp 2"};
  for (int i = 0; i < 3; ++i) {
    const std::string out = dir + "out" + std::to_string(i) + ".jsonl";
    RunResult r = run_pagoda("generate --model " + quote(model) + " --input-file " + quote(in) + " --output-file " +
                             quote(out) + " " + sizes[i]);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    std::ifstream file(out);
    for (std::string line; std::getline(file, line);) outputs[i].push_back(nlohmann::json::parse(line));
    ASSERT_EQ(outputs[i].size(), 5u) << sizes[i];
    const std::string text = outputs[i][4]["text"].get<std::string>();
    EXPECT_TRUE(std::regex_match(text, std::regex(" [a-z]+( [a-z]+){2,8}\\."))) << sizes[i] << ": " << text;
    EXPECT_EQ(outputs[i][4]["finish_reason"], "stop") << text;
  }
  for (int i = 1; i < 3; ++i) {
    for (size_t p = 0; p < 5; ++p) {
      nlohmann::json one = outputs[0][p], other = outputs[i][p];
      if (!one.is_array()) one = nlohmann::json::array({one}), other = nlohmann::json::array({other});
      ASSERT_EQ(one.size(), other.size()) << sizes[i] << " probe " << p;
      for (size_t c = 0; c < one.size(); ++c) {
        EXPECT_EQ(other[c]["token_ids"], one[c]["token_ids"]) << sizes[i] << " probe " << p;
        EXPECT_EQ(other[c]["finish_reason"], one[c]["finish_reason"]);
        if (i == 1 && one[c].contains("logprobs")) {
          EXPECT_EQ(other[c]["logprobs"], one[c]["logprobs"]) << "probe " << p;
        }
      }
    }
  }
  RunResult six = run_pagoda(greedy_256_args(model) + " -pp 6");
  EXPECT_EQ(six.exit_code, 1);
  EXPECT_NE(six.err.find("--pipeline-parallel-size 6 is more than the 5 layers"), std::string::npos) << six.err;
  // vLLM's VLLM_PP_LAYER_PARTITION: the stages' layers as given (1 and 4), the same text; a
  // partition that does not add up, or is not numbers, is refused naming it.
  RunResult uneven = run_pagoda(greedy_256_args(model) + " -pp 2", "VLLM_PP_LAYER_PARTITION=1,4");
  ASSERT_EQ(uneven.exit_code, 0) << uneven.err;
  EXPECT_EQ(uneven.out, golden_text(txt));
  RunResult wrong_sum = run_pagoda(greedy_256_args(model) + " -pp 2", "VLLM_PP_LAYER_PARTITION=2,2");
  EXPECT_EQ(wrong_sum.exit_code, 1);
  EXPECT_NE(wrong_sum.err.find("VLLM_PP_LAYER_PARTITION: the layer partition 2,2 sums to 4 layers, not the 5 of the model"),
            std::string::npos)
      << wrong_sum.err;
  RunResult words = run_pagoda(greedy_256_args(model) + " -pp 2", "VLLM_PP_LAYER_PARTITION=two,three");
  EXPECT_EQ(words.exit_code, 1);
  EXPECT_NE(words.err.find("VLLM_PP_LAYER_PARTITION 'two,three' is not a list of layer counts"), std::string::npos)
      << words.err;
}

// The same over MPI: `mpirun -np 2 pagoda generate ... -tp 2`, the ranks talking over TCP on the
// loopback interface as between hosts (rank 0 prints; mpirun gives it a pseudo-terminal, where
// generate ends the text with a newline). A job of another size than -tp is refused. Under ASan
// the leak check is off for these runs: Open MPI's plugins leak at MPI_Finalize and are unloaded
// by then, so their stacks cannot even be suppressed by library.
TEST(Cli, TensorParallelUnderMpirunKeepsTheGoldenText) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const std::string env = "OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ASAN_OPTIONS=detect_leaks=0";
  const std::string mpirun = std::string(MPIEXEC) + " --mca btl self,tcp --mca btl_tcp_if_include lo ";
  RunResult r = testing::run_binary(mpirun + "-np 2 " + PAGODA_BINARY, greedy_256_args(model) + " -tp 2", env);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, golden_text(txt) + "\n");
  // Two pipeline stages over MPI (its ranks send on a thread of their own: MPI_THREAD_MULTIPLE).
  RunResult pp = testing::run_binary(mpirun + "-np 2 " + PAGODA_BINARY, greedy_256_args(model) + " -pp 2", env);
  ASSERT_EQ(pp.exit_code, 0) << pp.err;
  EXPECT_EQ(pp.out, golden_text(txt) + "\n");
  RunResult wrong = testing::run_binary(mpirun + "-np 2 " + PAGODA_BINARY, greedy_256_args(model) + " -tp 4", env);
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(wrong.err.find("--tensor-parallel-size 4 x --pipeline-parallel-size 1 under an MPI job of 2 ranks"),
            std::string::npos)
      << wrong.err;
  // Each rank its own command line (mpirun's MPMD form): rank 1 converts the weights to q8_0.
  RunResult mismatched = testing::run_binary(
      mpirun + "-np 1 " + PAGODA_BINARY + " " + greedy_256_args(model) + " -tp 2 : -np 1 " + PAGODA_BINARY,
      greedy_256_args(model) + " -tp 2 --dtype q8_0", env);
  EXPECT_NE(mismatched.exit_code, 0);
  EXPECT_NE(mismatched.err.find("rank 1 loaded another model or configuration than rank 0"), std::string::npos)
      << mismatched.err;
  EXPECT_NE(mismatched.err.find("dtype q8_0"), std::string::npos) << mismatched.err;
}

// --dtype takes vLLM's names: float32 keeps stories260K's f32 weights (the golden text), half
// converts them (it runs; its text may drift from the golden one); q8_0 converts the matrices
// whose rows are whole 32-element blocks and gives the 172-wide feed-forward f16, as
// llama-quantize would, saying so in the log. --quantization takes llama-quantize's file types.
// Speculative decoding (n-gram drafts) leaves greedy output as it is: the golden text, from the
// reference implementation, with drafts verified several tokens a step. Bad configs: one line.
// The OffloadingConnector's disk tier across a restart, on two tensor-parallel ranks (each writes
// its own shard of every block): the second run loads the prompt's blocks from disk, and both
// print the text one plain process prints.
TEST(Cli, KvDiskTierAcrossRestartsWithTensorParallel) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const std::string dir = pagoda::testing::make_temp_dir() + "/kv";
  const std::string text =
      "generate --model " + quote(model) +
      " --prompt 'Once upon a time, there was a little girl named Lily. She liked to play with her ball in the park. "
      "One day, Lily saw a big dog. The dog was brown and it was very happy. Lily and the dog played all day long.'"
      " --max-tokens 24 --temperature 0";
  RunResult plain = run_pagoda(text);
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  const std::string tiered = text + " --verbose -tp 2 --kv-transfer-config " +
                             quote("{\"kv_connector\": \"OffloadingConnector\", \"kv_role\": \"kv_both\", "
                                   "\"kv_connector_extra_config\": {\"cpu_bytes_to_use\": 1000000, "
                                   "\"disk_path\": \"" + dir + "\"}}");
  RunResult first = run_pagoda(tiered);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_EQ(first.out, plain.out);
  EXPECT_NE(first.err.find("KV offloading: 0 prompt tokens loaded"), std::string::npos) << first.err;
  std::map<std::string, int> files;  // per rank
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    files[name.substr(name.find('.') + 1)] += 1;
  }
  EXPECT_GT(files["r0of2.kvb"], 0);
  EXPECT_EQ(files["r0of2.kvb"], files["r1of2.kvb"]);
  RunResult second = run_pagoda(tiered);
  ASSERT_EQ(second.exit_code, 0) << second.err;
  EXPECT_EQ(second.out, plain.out);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(second.err, m, std::regex("KV offloading: (\\d+) prompt tokens loaded \\((\\d+) from disk\\), 0 failed")))
      << second.err;
  EXPECT_GT(std::stoi(m[1]), 0);
  EXPECT_EQ(m[1], m[2]);
}

TEST(Cli, SpeculativeConfigKeepsTheGoldenText) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  // The last: the model as its own draft model.
  for (const std::string& config : {std::string(R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3, "prompt_lookup_min": 1})"),
                                   std::string(R"({"model": "ngram", "num_speculative_tokens": 7})"),
                                   R"({"model": ")" + model + R"(", "num_speculative_tokens": 3})"}) {
    RunResult r = run_pagoda(greedy_256_args(model) + " --speculative-config '" + config + "'");
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_EQ(r.out, golden_text(txt)) << config;
  }
  const std::string draft = R"({"model": ")" + model + R"(", "num_speculative_tokens": 3)";
  const std::pair<std::string, const char*> bad[] = {
      {R"({"method": "eagle", "num_speculative_tokens": 4})", "method 'eagle' is not supported"},
      {R"({"model": "/nonexistent/draft.gguf", "num_speculative_tokens": 4})",
       "draft model /nonexistent/draft.gguf: /nonexistent/draft.gguf: no such file"},
      {R"({"model": "demo-random", "num_speculative_tokens": 4})", "a draft must share the model's vocabulary"},
      {draft + R"(, "prompt_lookup_max": 3})", "prompt_lookup_min / prompt_lookup_max are for method ngram"},
      {R"({"method": "draft_model", "num_speculative_tokens": 4})", "method draft_model needs a model"},
      {draft + R"(, "method": "ngram"})", "method 'ngram' takes no model"},
      {R"({"method": "ngram"})", "needs num_speculative_tokens"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": "x"})", "prompt_lookup_max must be an integer"},
      {R"({"method": "ngram", "num_speculative_tokens": 999})", "num_speculative_tokens must be in [1, 128]"},
      {R"({"method": "ngram", "num_speculative_tokens": 4, "typo": 1})", "unknown field 'typo'"},
      {R"({"method": "ngram", )", "not valid JSON"},
  };
  for (const auto& [config, words] : bad) {
    RunResult r = run_pagoda(greedy_256_args(model) + " --speculative-config '" + config + "'");
    EXPECT_NE(r.exit_code, 0) << config;
    EXPECT_NE(r.err.find(words), std::string::npos) << config << ": " << r.err;
    EXPECT_EQ(count_lines(r.err), 1) << r.err;
  }
}

// The draft model runs in the worker of every tensor-parallel rank (each holds the whole draft
// and drafts alike): the golden text, and the drafts all accepted (the draft is the model).
TEST(Cli, TensorParallelRanksEachRunTheDraftModel) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const std::string draft = R"({"model": ")" + model + R"(", "num_speculative_tokens": 3})";
  RunResult r = run_pagoda(greedy_256_args(model) + " -tp 2 -v --speculative-config '" + draft + "'");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, golden_text(txt));
  EXPECT_NE(r.err.find("Speculative decoding: draft model " + model), std::string::npos) << r.err;
  // 255 tokens after the first: k = 3 drafts a step, each accepted, so about a quarter as many steps.
  EXPECT_NE(r.err.find("speculative decoding: "), std::string::npos) << r.err;
  const size_t at = r.err.find("speculative decoding: ");
  long long accepted = -1, drafted = -1;
  ASSERT_EQ(std::sscanf(r.err.c_str() + at, "speculative decoding: %lld of %lld", &accepted, &drafted), 2) << r.err;
  EXPECT_GT(drafted, 150) << r.err;
  EXPECT_EQ(accepted, drafted) << r.err;
}

// The device seam (backend/kernels.h) holds: on the "guarded" test backend, whose memory the host
// cannot read or write outside its kernel entries (any access above the backend dies of SIGSEGV),
// stories260K gives its golden text alone, over 2 tensor-parallel ranks and over 2 pipeline
// stages; W8A8 codes (pack_int_weight, matmul_int) and a mixture of experts with a shared expert
// (moe_route, gather_rows, moe_combine) give exactly what the CPU's scalar kernels give, the latter
// over 2 tensor-parallel ranks too.
TEST(Cli, TheGuardedBackendKeepsTheDeviceSeam) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const std::string golden = golden_text(txt);
  for (const char* parallel : {"", " -tp 2", " -pp 2"}) {
    RunResult r = run_pagoda(greedy_256_args(model) + " --backend guarded -v" + parallel);
    ASSERT_EQ(r.exit_code, 0) << parallel << ": " << r.err;
    EXPECT_EQ(r.out, golden) << parallel;
    EXPECT_NE(r.err.find("guarded: the scalar reference kernels"), std::string::npos) << r.err;
  }
  const std::string dir = pagoda::testing::make_temp_dir();
  std::ofstream(dir + "/config.json") << R"({"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 128,
      "intermediate_size": 256, "moe_intermediate_size": 64, "shared_expert_intermediate_size": 96,
      "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": false, "num_hidden_layers": 2,
      "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512, "max_position_embeddings": 512,
      "rms_norm_eps": 1e-6, "rope_theta": 1000000.0})";
  const std::string moe = "generate --model " + quote(dir) + " --load-format dummy --tokenizer " + quote(model) +
                          " --prompt 'Once upon a time' --max-tokens 32 --temperature 0";
  const std::string w8a8 = "generate --model " + quote(model) + " --prompt '' --max-tokens 48 --temperature 0 --quantization w8a8";
  for (const std::string& args : {moe, moe + " -tp 2", w8a8}) {
    RunResult scalar = run_pagoda(args, "PAGODA_CPU_ISA=scalar");
    RunResult guarded = run_pagoda(args + " --backend guarded");
    ASSERT_EQ(scalar.exit_code, 0) << scalar.err;
    ASSERT_EQ(guarded.exit_code, 0) << guarded.err;
    EXPECT_FALSE(guarded.out.empty());
    EXPECT_EQ(guarded.out, scalar.out) << args;
  }
  std::filesystem::remove_all(dir);
}

TEST(Cli, DtypeConvertsFileWeights) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(txt, "stories260K/greedy-bos-256.txt");
  const std::string want = golden_text(txt);
  const std::string args = greedy_256_args(model);
  RunResult f32 = run_pagoda(args + " --dtype float32");
  ASSERT_EQ(f32.exit_code, 0) << f32.err;
  EXPECT_EQ(f32.out, want);
  RunResult half = run_pagoda(args + " --dtype half");
  ASSERT_EQ(half.exit_code, 0) << half.err;
  EXPECT_GT(half.out.size(), want.size() / 2);
  RunResult q8 = run_pagoda(args + " --dtype q8_0");
  ASSERT_EQ(q8.exit_code, 0) << q8.err;
  EXPECT_GT(q8.out.size(), want.size() / 2);
  // stories260K: 5 layers of 7 matrices, token_embd and output: 5 ffn_down f16, 32 q8_0.
  EXPECT_NE(q8.err.find("weights typed by q8_0 at load (float ones converted, quantized ones as stored): 5 f16, 32 q8_0"),
            std::string::npos)
      << q8.err;
  RunResult q4km = run_pagoda(args + " --quantization q4_k_m");
  ASSERT_EQ(q4km.exit_code, 0) << q4km.err;
  // Rows of 64 are not whole super-blocks: Q4_K gives way to Q5_0, Q6_K to Q8_0 (attn_v, the
  // output and the use_more_bits layers' ffn_down, which 172 sends on to f16).
  EXPECT_NE(q4km.err.find("weights typed by q4_k_m"), std::string::npos) << q4km.err;
  EXPECT_NE(q4km.err.find("q5_0"), std::string::npos) << q4km.err;
  EXPECT_NE(q4km.err.find("q8_0"), std::string::npos) << q4km.err;
  RunResult bad = run_pagoda(args + " --quantization q4_k");
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("q4_k_m"), std::string::npos) << bad.err;  // the list of what is supported
}

// pagoda quantize writes what --quantization applies at load: the file's perplexity is the
// online one to the last digit, general.file_type says the type, every metadata entry (the
// tokenizer's among them) came across, and the tensors have the mix's types.
TEST(Cli, QuantizeWritesWhatLoadTimeQuantizationComputes) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const std::string dir = testing::make_temp_dir();
  const std::string text = std::string(PAGODA_SOURCE_DIR) + "/tests/data/short-stories.txt";
  RunResult q = run_pagoda("quantize " + quote(model) + " " + quote(dir + "/q4km.gguf") + " --type q4_k_m");
  ASSERT_EQ(q.exit_code, 0) << q.err;
  EXPECT_NE(q.out.find("general.file_type 15"), std::string::npos) << q.out;
  auto ppl = [&](const std::string& args, const std::string& json_name) {
    RunResult r = run_pagoda("perplexity -f " + quote(text) + " --ctx 64 --chunks 8 --output-json " +
                             quote(dir + "/" + json_name) + " " + args);
    EXPECT_EQ(r.exit_code, 0) << r.err;
    std::ifstream in(dir + "/" + json_name);
    return nlohmann::json::parse(in)["ppl"].get<double>();
  };
  const double file = ppl("--model " + quote(dir + "/q4km.gguf"), "file.json");
  const double online = ppl("--model " + quote(model) + " --quantization q4_k_m", "online.json");
  const double f32 = ppl("--model " + quote(model), "f32.json");
  EXPECT_EQ(file, online);
  EXPECT_NE(file, f32);

  auto in = GgufFile::open(model);
  auto out = GgufFile::open(dir + "/q4km.gguf");
  ASSERT_TRUE(in.ok() && out.ok());
  EXPECT_EQ(*(*out)->get_int("general.file_type"), 15);
  for (const auto& [key, value] : (*in)->metadata()) {
    const GgufValue* copied = (*out)->find(key);
    ASSERT_NE(copied, nullptr) << key;
    EXPECT_EQ(copied->type, value.type) << key;
    EXPECT_EQ(copied->count, value.count) << key;
  }
  EXPECT_EQ(*(*out)->get_string_array("tokenizer.ggml.tokens"), *(*in)->get_string_array("tokenizer.ggml.tokens"));
  // Rows of 64: Q4_K falls back to Q5_0, Q6_K (output, attn_v of layers 2 and 4) to Q8_0; 172: f16.
  EXPECT_EQ((*out)->find_tensor("blk.0.attn_q.weight")->tensor.dtype, DType::kQ5_0);
  EXPECT_EQ((*out)->find_tensor("blk.2.attn_v.weight")->tensor.dtype, DType::kQ8_0);
  EXPECT_EQ((*out)->find_tensor("output.weight")->tensor.dtype, DType::kQ8_0);
  EXPECT_EQ((*out)->find_tensor("blk.1.ffn_down.weight")->tensor.dtype, DType::kF16);
  EXPECT_EQ((*out)->find_tensor("blk.1.ffn_norm.weight")->tensor.dtype, DType::kF32);

  RunResult bad_type = run_pagoda("quantize " + quote(model) + " " + quote(dir + "/x.gguf") + " --type q4_k");
  EXPECT_EQ(bad_type.exit_code, 1);
  EXPECT_NE(bad_type.err.find("--type q4_k is not supported; supported: w8a8, w4a8 (a compressed-tensors folder), q8_0, q4_0"),
            std::string::npos)
      << bad_type.err;
  RunResult not_gguf = run_pagoda("quantize " + quote(text) + " " + quote(dir + "/x.gguf") + " --type q8_0");
  EXPECT_EQ(not_gguf.exit_code, 1);
  EXPECT_NE(not_gguf.err.find("short-stories.txt: not a GGUF file"), std::string::npos) << not_gguf.err;
  RunResult unwritable = run_pagoda("quantize " + quote(model) + " " + quote(dir + "/no/such/dir/x.gguf") + " --type q8_0");
  EXPECT_EQ(unwritable.exit_code, 1);
  EXPECT_NE(unwritable.err.find(dir + "/no/such/dir/x.gguf"), std::string::npos) << unwritable.err;
  std::filesystem::remove_all(dir);
}

// `pagoda perplexity` of `model_args` on `text` (--ctx 128) against the base run dir/base.bin:
// its "kl" object, as --output-json writes it to dir/json_name.
nlohmann::json kl_against_base(const std::string& dir, const std::string& text, const std::string& model_args,
                               const std::string& json_name) {
  RunResult r = run_pagoda("perplexity -f " + quote(text) + " --ctx 128 --kl-base " + quote(dir + "/base.bin") +
                           " --output-json " + quote(dir + "/" + json_name) + " " + model_args);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(dir + "/" + json_name);
  return nlohmann::json::parse(in)["kl"];
}

// pagoda quantize --type w8a8 with calibration: a compressed-tensors folder with a static
// activation scale per projection, which loads (with the GGUF as tokenizer) and stays close to the
// float model on text it was not calibrated on; SmoothQuant's migration (--smooth-alpha 0.5)
// brings it closer (on stories260K: mean KL divergence 0.0105 static, 0.0045 smoothed). What
// cannot work is refused naming the problem.
TEST(Cli, QuantizeCalibratesStaticW8A8AndSmoothQuantHelps) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const std::string dir = testing::make_temp_dir();
  const std::string data = std::string(PAGODA_SOURCE_DIR) + "/tests/data/";
  const std::string text = data + "short-stories.txt", calibration = data + "calibration.jsonl";
  auto quantize = [&](const std::string& out, const std::string& args) {
    RunResult q = run_pagoda("quantize " + quote(model) + " " + quote(dir + "/" + out) + " --type w8a8 " + args);
    EXPECT_EQ(q.exit_code, 0) << q.err;
    return q;
  };
  auto kl = [&](const std::string& args, const std::string& json_name) {
    return kl_against_base(dir, text, args, json_name);
  };
  ASSERT_EQ(run_pagoda("perplexity -f " + quote(text) + " --ctx 128 --save-logits " + quote(dir + "/base.bin") +
                       " --model " + quote(model)).exit_code, 0);
  RunResult fixed = quantize("static", "--calibration-file " + quote(calibration));
  EXPECT_NE(fixed.out.find("calibration: 16 texts"), std::string::npos) << fixed.out;
  EXPECT_NE(fixed.out.find("static per-tensor activations"), std::string::npos) << fixed.out;
  quantize("smooth", "--calibration-file " + quote(calibration) + " --smooth-alpha 0.5");
  // The folder as written: codes, their scales and one input_scale per projection.
  auto st = load_model(dir + "/static", LoadOptions{});
  ASSERT_TRUE(st.ok()) << st.status().message();
  EXPECT_TRUE(st->config.quantization.static_input_scales);
  EXPECT_EQ(st->weights.find("blk.3.ffn_down.weight")->dtype, DType::kI8);
  ASSERT_NE(st->weights.find("blk.3.ffn_down.input_scale"), nullptr);
  EXPECT_GT(*static_cast<const float*>(st->weights.find("blk.3.ffn_down.input_scale")->data), 0.0f);

  const auto k_static = kl("--model " + quote(dir + "/static") + " --tokenizer " + quote(model), "static.json");
  const auto k_smooth = kl("--model " + quote(dir + "/smooth") + " --tokenizer " + quote(model), "smooth.json");
  std::printf("static W8A8: mean KLD %.5f, same top token %.3f; smoothed: %.5f, %.3f\n", k_static["mean_kld"].get<double>(),
              k_static["top1_agreement"].get<double>(), k_smooth["mean_kld"].get<double>(),
              k_smooth["top1_agreement"].get<double>());
  EXPECT_LT(k_static["mean_kld"].get<double>(), 0.03);
  EXPECT_GT(k_static["top1_agreement"].get<double>(), 0.9);
  EXPECT_LT(k_smooth["mean_kld"].get<double>(), 0.7 * k_static["mean_kld"].get<double>());
  EXPECT_GT(k_smooth["top1_agreement"].get<double>(), k_static["top1_agreement"].get<double>());

  const struct {
    std::string args, message;
  } kRefused[] = {
      {" --smooth-alpha 0.5", "--smooth-alpha needs --calibration-file"},
      {" --calibration-file " + quote(text), "short-stories.txt:1: not JSON"},
      {" --calibration-file " + quote(calibration) + " --smooth-alpha 2", "--smooth-alpha must be in [0, 1]"},
  };
  for (const auto& r : kRefused) {
    RunResult bad = run_pagoda("quantize " + quote(model) + " " + quote(dir + "/bad") + " --type w8a8" + r.args);
    EXPECT_EQ(bad.exit_code, 1) << r.args;
    EXPECT_NE(bad.err.find(r.message), std::string::npos) << bad.err;
  }
  ASSERT_EQ(run_pagoda("quantize " + quote(model) + " " + quote(dir + "/q8.gguf") + " --type q8_0").exit_code, 0);
  RunResult quantized = run_pagoda("quantize " + quote(dir + "/q8.gguf") + " " + quote(dir + "/bad") + " --type w8a8");
  EXPECT_EQ(quantized.exit_code, 1);
  EXPECT_NE(quantized.err.find("is q8_0; pagoda quantize --type w8a8 reads float (f32, f16, bf16) weights"),
            std::string::npos)
      << quantized.err;
  std::filesystem::remove_all(dir);
}

// GPTQ (tools/quantize/gptq.h) against round-to-nearest on the real model: the same types and bytes,
// and a smaller divergence from the f32 model on a text it was not calibrated on.
TEST(Cli, QuantizeWithGptqLowersTheDivergence) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  PAGODA_TEST_FILE(llama_vocab, "vocab/ggml-vocab-llama-spm.gguf");
  const std::string dir = testing::make_temp_dir();
  const std::string data = std::string(PAGODA_SOURCE_DIR) + "/tests/data/";
  const std::string text = data + "short-stories.txt", calibration = data + "calibration.jsonl";
  const std::string gptq = " --gptq --calibration-file " + quote(calibration);
  auto quantize = [&](const std::string& out, const std::string& args) {
    RunResult q = run_pagoda("quantize " + quote(model) + " " + quote(dir + "/" + out) + " " + args);
    EXPECT_EQ(q.exit_code, 0) << q.err;
    return q;
  };
  auto mean_kld = [&](const std::string& model_args, const std::string& json_name) {
    return kl_against_base(dir, text, model_args, json_name)["mean_kld"].get<double>();
  };
  ASSERT_EQ(run_pagoda("perplexity -f " + quote(text) + " --ctx 128 --save-logits " + quote(dir + "/base.bin") +
                       " --model " + quote(model)).exit_code, 0);
  quantize("rtn.gguf", "--type q4_0");
  RunResult q = quantize("gptq.gguf", "--type q4_0" + gptq);
  EXPECT_NE(q.out.find("calibration: 16 texts"), std::string::npos) << q.out;
  // Every projection but the 172-wide ffn_down (f16 in the mix) and the untied LM head.
  EXPECT_NE(q.out.find("30 q4_0 (GPTQ), 1 q8_0 (GPTQ)"), std::string::npos) << q.out;
  quantize("w4a8-rtn", "--type w4a8");
  RunResult w = quantize("w4a8-gptq", "--type w4a8" + gptq);
  EXPECT_NE(w.out.find("per-token activations, GPTQ weights"), std::string::npos) << w.out;
  auto gptq_gguf = GgufFile::open(dir + "/gptq.gguf");
  auto rtn_gguf = GgufFile::open(dir + "/rtn.gguf");
  ASSERT_TRUE(gptq_gguf.ok() && rtn_gguf.ok());
  for (const char* name : {"blk.2.attn_q.weight", "output.weight", "token_embd.weight", "blk.2.ffn_down.weight"}) {
    const GgufTensorInfo* a = (*gptq_gguf)->find_tensor(name);
    const GgufTensorInfo* b = (*rtn_gguf)->find_tensor(name);
    ASSERT_TRUE(a != nullptr && b != nullptr) << name;
    EXPECT_EQ(a->tensor.dtype, b->tensor.dtype) << name;
    ASSERT_EQ(a->tensor.nbytes(), b->tensor.nbytes()) << name;
    // GPTQ changes the projections' codes; the embedding and the f16 rows are as before.
    const bool same = std::memcmp(a->tensor.data, b->tensor.data, static_cast<size_t>(a->tensor.nbytes())) == 0;
    EXPECT_EQ(same, std::string(name) == "token_embd.weight" || std::string(name) == "blk.2.ffn_down.weight") << name;
  }

  const double rtn = mean_kld("--model " + quote(dir + "/rtn.gguf"), "rtn.json");
  const double by_gptq = mean_kld("--model " + quote(dir + "/gptq.gguf"), "gptq.json");
  const double w_rtn = mean_kld("--model " + quote(dir + "/w4a8-rtn") + " --tokenizer " + quote(model), "w-rtn.json");
  const double w_gptq = mean_kld("--model " + quote(dir + "/w4a8-gptq") + " --tokenizer " + quote(model), "w-gptq.json");
  std::printf("mean KLD against f32: q4_0 %.5f, with GPTQ %.5f; w4a8 %.5f, with GPTQ %.5f\n", rtn, by_gptq, w_rtn, w_gptq);
  EXPECT_LT(by_gptq, 0.85 * rtn);
  EXPECT_LT(w_gptq, 0.85 * w_rtn);
  // Act-order (the default) against the stored order: on this model it lowers q4_0's and w4a8's
  // divergence by 10% and 13% (docs/quantization.md).
  quantize("stored-order.gguf", "--type q4_0 --act-order false" + gptq);
  quantize("w4a8-stored-order", "--type w4a8 --act-order false" + gptq);
  const double stored = mean_kld("--model " + quote(dir + "/stored-order.gguf"), "stored.json");
  const double w_stored =
      mean_kld("--model " + quote(dir + "/w4a8-stored-order") + " --tokenizer " + quote(model), "w-stored.json");
  std::printf("GPTQ in stored order: q4_0 %.5f, w4a8 %.5f\n", stored, w_stored);
  EXPECT_LT(by_gptq, 0.95 * stored);
  EXPECT_LT(w_gptq, 0.95 * w_stored);

  const struct {
    std::string type, args, message;
  } kRefused[] = {
      {"q4_0", " --gptq", "--gptq needs --calibration-file"},
      {"w8a8", " --gptq", "--gptq needs --calibration-file"},
      {"q4_0", " --calibration-file " + quote(calibration), "--calibration-file with a GGUF type needs --gptq"},
      {"q4_0", gptq + " --smooth-alpha 0.5", "--smooth-alpha applies to --type w8a8 / w4a8"},
      {"w8a8", gptq + " --smooth-alpha 0.5", "--gptq with --smooth-alpha is not supported"},
      {"q4_0", " --gptq --calibration-file " + quote(text), "short-stories.txt:1: not JSON"},
      // A 32,000-token vocabulary's ids against a 512-token model: refused, not read past the table.
      {"w4a8", gptq + " --tokenizer " + quote(llama_vocab), "outside the model's vocabulary of 512"},
  };
  for (const auto& r : kRefused) {
    RunResult bad = run_pagoda("quantize " + quote(model) + " " + quote(dir + "/bad") + " --type " + r.type + r.args);
    EXPECT_EQ(bad.exit_code, 1) << r.args;
    EXPECT_NE(bad.err.find(r.message), std::string::npos) << bad.err;
  }
  std::filesystem::remove_all(dir);
}

// The same seed gives the same text; another seed, other text; temperature 0 the same text
// whatever the seed, and temperature 1 with the same seed other text. (A sampler that ignored
// --seed or --temperature fails one of these.)
TEST(Cli, SeededSamplingIsReproducibleAndSeedAndTemperatureMatter) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  auto generate = [&](const std::string& temperature, int seed) {
    RunResult r = run_pagoda("generate --model " + quote(model) +
                             " --prompt 'Once upon a time' --max-tokens 40 --top-p 0.95 --top-k 40 --temperature " +
                             temperature + " --seed " + std::to_string(seed));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_FALSE(r.out.empty()) << "temperature " << temperature << ", seed " << seed;
    return r.out;
  };
  const std::string seed7 = generate("0.9", 7);
  EXPECT_EQ(generate("0.9", 7), seed7);
  EXPECT_NE(generate("0.9", 8), seed7);
  const std::string greedy = generate("0", 7);
  EXPECT_EQ(generate("0", 8), greedy);
  EXPECT_NE(generate("1", 7), greedy);
}

TEST(Cli, TokenizePrintsJsonIds) {
  PAGODA_TEST_FILE(vocab, "vocab/ggml-vocab-llama-spm.gguf");
  RunResult r = run_pagoda("tokenize --model " + quote(vocab) + " --prompt 'Hello world' --no-add-special");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "[15043, 3186]\n");  // llama.cpp's vector for "Hello world"
  RunResult with_bos = run_pagoda("tokenize --model " + quote(vocab) + " --prompt 'Hello world'");
  EXPECT_EQ(with_bos.out, "[1, 15043, 3186]\n");
}

TEST(Cli, BatchFileGivesOneResultPerLineInOrder) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const std::string dir = pagoda::testing::make_temp_dir() + "/";
  const std::string in = dir + "prompts.jsonl";
  const std::string out = dir + "results.jsonl";
  std::ofstream(in) << "{\"prompt\": \"Once upon a time\", \"max_tokens\": 12, \"temperature\": 0}\n"
                    << "\n"
                    << "{\"prompt\": \"Lily had a dog\", \"n\": 2, \"temperature\": 1.0, \"seed\": 3}\n"
                    << "{\"prompt\": \"Tom saw\", \"stop\": [\".\"], \"max_tokens\": 60, \"temperature\": 0}\n";
  RunResult r = run_pagoda("generate --model " + quote(model) + " --input-file " + quote(in) +
                           " --output-file " + quote(out) + " --max-tokens 9");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream results(out);
  std::vector<std::string> lines;
  for (std::string line; std::getline(results, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  RunResult single = run_pagoda("generate --model " + quote(model) + " --prompt 'Once upon a time' -n 12 -t 0");
  auto first = nlohmann::json::parse(lines[0]), second = nlohmann::json::parse(lines[1]),
       third = nlohmann::json::parse(lines[2]);
  EXPECT_EQ(first["text"], single.out);
  EXPECT_EQ(first["token_ids"].size(), 12u);
  EXPECT_EQ(first["finish_reason"], "length");
  EXPECT_EQ(first["usage"]["completion_tokens"], 12);
  ASSERT_EQ(second["outputs"].size(), 2u);
  EXPECT_EQ(second["usage"]["completion_tokens"], 18);  // n = 2, the default --max-tokens 9 each
  EXPECT_EQ(third["finish_reason"], "stop");
  EXPECT_EQ(third["text"].get<std::string>().find('.'), std::string::npos);

  std::ofstream(in) << "{\"prompt\": \"ok\"}\n{\"prompt\": \"x\", \"top_p\": \"high\"}\n";
  RunResult bad = run_pagoda("generate --model " + quote(model) + " --input-file " + quote(in));
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find(in + ":2: Invalid type for 'top_p': expected a number"), std::string::npos) << bad.err;
}

TEST(Cli, BenchThroughputReportsRates) {
  RunResult r = run_pagoda("bench throughput --model demo-random --input-len 16 --output-len 8 --num-prompts 4");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("requests/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("output tokens/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("Total num output tokens:  32"), std::string::npos) << r.out;
}

TEST(Cli, BenchThroughputReadsPromptFile) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const std::string dir = pagoda::testing::make_temp_dir() + "/";
  const std::string in = dir + "bench_prompts.jsonl";
  const std::string out = dir + "bench_thr.json";
  std::ofstream(in) << "{\"prompt\": \"Once upon a time\", \"output_len\": 20}\n\n{\"prompt\": \"The cat\"}\n";
  RunResult r = run_pagoda("bench throughput --model " + quote(model) + " --dataset-path " + quote(in) +
                           " --output-len 10 --output-json " + quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(out);
  auto j = nlohmann::json::parse(f);
  EXPECT_EQ(j["num_requests"], 2);
  EXPECT_EQ(j["total_output_tokens"], 30);  // 20 from the file, 10 from --output-len
}

// One batch several times: every iteration is timed, prefill comes before the end, and the
// decode step time is what is left per output token.
TEST(Cli, BenchLatencySeparatesPrefillAndDecode) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const std::string out = pagoda::testing::make_temp_dir() + "/bench_lat.json";
  RunResult r = run_pagoda("bench latency --model " + quote(model) +
                           " --batch-size 4 --input-len 32 --output-len 16 --num-iters 3 --num-iters-warmup 1"
                           " --output-json " + quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Avg latency: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("99% percentile latency: "), std::string::npos) << r.out;
  std::ifstream f(out);
  auto j = nlohmann::json::parse(f);
  ASSERT_EQ(j["latencies"].size(), 3u);
  ASSERT_EQ(j["prefill_latencies"].size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GT(j["prefill_latencies"][i].get<double>(), 0.0);
    EXPECT_LT(j["prefill_latencies"][i].get<double>(), j["latencies"][i].get<double>());
  }
  double sum = 0;
  for (const auto& l : j["latencies"]) sum += l.get<double>();
  EXPECT_NEAR(j["avg_latency"].get<double>(), sum / 3, 1e-9);
  EXPECT_GT(j["avg_decode_step_latency"].get<double>(), 0.0);
}

// The machine's limits are measured (positive rates), and each ceiling follows from them and
// the bytes one decode step reads, which for an untied model are all its parameters but the
// embedding table and the norms (ModelConfig::num_parameters counts those in), at each type's size.
TEST(Cli, BenchRooflineMeasuresAndDerivesCeilings) {
  const std::string out = pagoda::testing::make_temp_dir() + "/roofline.json";
  RunResult r = run_pagoda("bench roofline --buffer 256MiB --seconds 0.05 --output-json " + quote(out));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Memory read bandwidth:"), std::string::npos) << r.out;
  std::ifstream f(out);
  auto j = nlohmann::json::parse(f);
  const double gbps = j["read_gbps"].get<double>();
  EXPECT_GT(gbps, 0.1);
  EXPECT_GT(j["f32_fma_gflops"].get<double>(), 0.1);
  // The int8 multiply-add peak where the kernels have one (AVX2 or VNNI), else 0.
  const std::string int8_isa = j["int8_isa"].get<std::string>();
  EXPECT_EQ(int8_isa.empty(), j["int8_dot_gops"].get<double>() == 0) << int8_isa;
  if (!int8_isa.empty()) {
    EXPECT_NE(r.out.find("int8 dot peak (" + int8_isa + ")"), std::string::npos) << r.out;
  }
  auto c = dummy_preset("tinyllama-1.1b");
  ASSERT_TRUE(c.has_value());
  ASSERT_FALSE(c->tie_word_embeddings);
  const int64_t weights = c->num_parameters() - c->vocab_size * c->hidden_size - (2 * c->num_layers + 1) * c->hidden_size;
  const std::map<std::string, double> bytes_per_weight = {
      {"f32", 4.0},          {"f16", 2.0},           {"bf16", 2.0},          {"q8_0", 34.0 / 32},
      {"q4_0", 18.0 / 32},   {"q4_1", 20.0 / 32},    {"q5_0", 22.0 / 32},    {"q5_1", 24.0 / 32},
      {"q2_k", 84.0 / 256},  {"q3_k", 110.0 / 256},  {"q4_k", 144.0 / 256},  {"q5_k", 176.0 / 256},
      {"q6_k", 210.0 / 256}};  // bytes per block / elements per block, from the block layouts
  // A mixture of experts reads its active parameters: the router and 8 of 128 experts a layer.
  auto moe = dummy_preset("qwen3-30b-a3b");
  ASSERT_TRUE(moe.has_value() && !moe->tie_word_embeddings && moe->qk_norm);
  const int64_t active = moe->num_active_parameters() - moe->vocab_size * moe->hidden_size -
                         (2 * moe->num_layers + 1) * moe->hidden_size - 2 * moe->num_layers * moe->head_dim;
  int seen = 0, seen_moe = 0;
  for (const auto& e : j["ceilings"]) {
    const int64_t bytes = e["bytes_per_decode_step"].get<int64_t>();
    EXPECT_NEAR(e["decode_ceiling_tokens_per_s"].get<double>(), gbps * 1e9 / static_cast<double>(bytes), 1e-6 * gbps * 1e9 / bytes);
    const double per_weight = bytes_per_weight.at(e["type"].get<std::string>());
    if (e["model"] == "qwen3-30b-a3b") {
      ++seen_moe;
      EXPECT_EQ(static_cast<double>(bytes), static_cast<double>(active) * per_weight) << e.dump();
    }
    if (e["model"] != "tinyllama-1.1b") continue;
    ++seen;
    EXPECT_EQ(static_cast<double>(bytes), static_cast<double>(weights) * per_weight) << e.dump();
  }
  EXPECT_EQ(seen, static_cast<int>(bytes_per_weight.size()));
  EXPECT_EQ(seen_moe, static_cast<int>(bytes_per_weight.size()));
}

// A sweep runs one benchmark per grid point (a fresh engine each), and the CSV, the chart and the
// best point agree with the per-point results it kept.
TEST(Cli, BenchSweepWritesCsvChartAndBest) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  const std::string dir = pagoda::testing::make_temp_dir() + "/sweep";
  RunResult r = run_pagoda("bench sweep --mode throughput --param max-num-seqs=1,8 --model-args '--model " + model +
                           "' --bench-args '--input-len 16 --output-len 16 --num-prompts 8' --work-dir " + quote(dir) +
                           " --output-csv " + quote(dir + ".csv") + " --output-svg " + quote(dir + ".svg"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::ifstream csv(dir + ".csv");
  std::vector<std::string> lines;
  for (std::string line; std::getline(csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0], "max-num-seqs,request_throughput,output_throughput,total_token_throughput");
  double best = 0;
  std::string best_value;
  for (int i = 0; i < 2; ++i) {
    std::ifstream point(dir + "/point" + std::to_string(i) + ".json");
    auto j = nlohmann::json::parse(point);
    EXPECT_EQ(j["num_requests"], 8);
    const double t = j["output_tokens_per_second"].get<double>();
    EXPECT_EQ(lines[static_cast<size_t>(i) + 1].substr(0, lines[static_cast<size_t>(i) + 1].find(',')), i == 0 ? "1" : "8");
    if (t > best) {
      best = t;
      best_value = i == 0 ? "1" : "8";
    }
  }
  EXPECT_NE(r.out.find("best: max-num-seqs=" + best_value + " "), std::string::npos) << r.out;
  std::ifstream svg(dir + ".svg");
  const std::string chart((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  EXPECT_EQ(chart.rfind("<svg", 0), 0u);
  EXPECT_NE(chart.find("<polyline"), std::string::npos);

  // Serve mode: a server per engine setting, bench serve against it; a goal nobody can meet.
  RunResult s = run_pagoda("bench sweep --mode serve --param request-rate=100,inf --model-args " + quote(model) +
                           " --bench-args '--num-prompts 10 --random-input-len 8 --random-output-len 4 --ignore-eos'"
                           " --latency-goal p99_ttft:0.000001 --work-dir " + quote(dir + "-serve") + " --output-csv " +
                           quote(dir + "-serve.csv") + " --output-svg " + quote(dir + "-serve.svg"));
  ASSERT_EQ(s.exit_code, 0) << s.out << s.err;
  std::ifstream serve_csv(dir + "-serve.csv");
  lines.clear();
  for (std::string line; std::getline(serve_csv, line);) lines.push_back(line);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].rfind("request-rate,request_throughput,output_throughput,mean_ttft_ms,p99_ttft_ms", 0), 0u);
  EXPECT_EQ(lines[1].rfind("100,", 0), 0u);
  EXPECT_EQ(lines[2].rfind("inf,", 0), 0u);
  EXPECT_NE(s.out.find("best: none meets the latency goal"), std::string::npos) << s.out;
}

TEST(Cli, DemoModelRunsWithNothingDownloaded) {
  RunResult r = run_pagoda("generate --model demo-random --prompt 'Hi' --max-tokens 8 --temperature 0");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("generated tokens: 8"), std::string::npos) << r.err;
}

// The built-in mixture-of-experts shapes: one that cannot fit in memory is refused before any
// weight is made, saying how much it needs (f32 Mixtral-8x7B: 174 GiB).
TEST(Cli, DummyPresetThatCannotFitIsRefusedBeforeLoading) {
  PAGODA_TEST_FILE(tokenizer, "vocab/ggml-vocab-llama-spm.gguf");
  RunResult r = run_pagoda("generate --model mixtral-8x7b --dtype f32 --tokenizer " + tokenizer + " --prompt hi --max-tokens 1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("mixtral-8x7b: dummy weights in f32 need 174.0 GiB"), std::string::npos) << r.err;
}

TEST(Cli, HelpOnEverySubcommand) {
  RunResult top = run_pagoda("--help");
  EXPECT_EQ(top.exit_code, 0);
  EXPECT_NE(top.out.find("generate"), std::string::npos) << top.out;
  EXPECT_NE(top.out.find("tokenize"), std::string::npos) << top.out;
  for (const char* sub : {"serve", "bench serve", "bench latency", "bench throughput"}) {
    RunResult r = run_pagoda(std::string(sub) + " --help");
    EXPECT_EQ(r.exit_code, 0) << sub;
    EXPECT_NE(r.out.find(std::string(sub) == "bench serve" ? "--base-url" : "--max-num-seqs"), std::string::npos)
        << sub << r.out;
  }
  for (const char* sub : {"generate", "tokenize"}) {
    RunResult r = run_pagoda(std::string(sub) + " --help");
    EXPECT_EQ(r.exit_code, 0) << sub;
    EXPECT_NE(r.out.find("--model"), std::string::npos) << sub << r.out;
    EXPECT_NE(r.out.find("--prompt"), std::string::npos) << sub << r.out;
  }
}

TEST(Cli, ErrorsAreOneLineAndNonZero) {
  const char* cases[] = {
      "generate --model /nonexistent/model.gguf --prompt hi",
      "generate --model demo-random --temperature -1 --prompt hi",
      "generate --model demo-random --max-tokens 100000 --prompt hi",
      "generate --model demo-random --no-such-flag",
      "generate --model demo-random --dtype float64 --prompt hi",
      "frobnicate",
  };
  for (const char* args : cases) {
    RunResult r = run_pagoda(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_EQ(count_lines(r.err), 1) << args << ": " << r.err;
    EXPECT_EQ(r.err.rfind("pagoda: error: ", 0), 0u) << args << ": " << r.err;
    EXPECT_EQ(r.out, "") << args;
  }
}

// An empty model (the service's PAGODA_MODEL left unset) is named as such, not "no such file".
TEST(Cli, AnEmptyModelIsRefusedAsMissing) {
  for (const char* command : {"generate --model '' --prompt hi", "serve --model '' --port 0"}) {
    RunResult r = run_pagoda(command);
    EXPECT_EQ(r.exit_code, 1) << command;
    EXPECT_NE(r.err.find("pagoda: error: no model given"), std::string::npos) << command << ": " << r.err;
  }
}

TEST(Cli, CorruptModelFileNamesFileAndProblem) {
  PAGODA_TEST_FILE(model, "stories260K/stories260K.gguf");
  std::string path = pagoda::testing::make_temp_dir() + "/truncated-stories.gguf";
  {
    std::ifstream in(model, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(path, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  RunResult r = run_pagoda("generate --model " + quote(path) + " --prompt hi");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(count_lines(r.err), 1) << r.err;
  EXPECT_NE(r.err.find(path), std::string::npos) << r.err;
  std::remove(path.c_str());
}

}  // namespace
}  // namespace pagoda
