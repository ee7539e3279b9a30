// The determinism suite (determinism_check.h) on the dummy GQA-8 model of determinism_test.cpp,
// and on a mixture of experts of the same widths, in every weight type (bf16, each GGUF block
// type, W8A8, W4A8) and KV cache type (int8, fp8), on every SIMD kernel table compiled in
// (cpu_kernel_tables(); a table the CPU lacks skips, saying so). Not on the scalar reference
// kernels: each of their outputs is one loop in a fixed order whatever the batch, and here they
// take 40 s a case. Rows of 256 and 512, so every K-quant
// applies as it is. A binary of its own because the sanitizer build leaves it out (Makefile):
// there the K-quant tiles run hundreds of times slower
// (q2_k: 290 s against 0.9 s; every 32-byte access to their stack arrays goes through ASan's
// region check), and their memory safety is what cpu_simd_kernels_test checks under ASan for
// every type.
#include <gtest/gtest.h>

#include <cctype>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/cpu_features.h"
#include "determinism_check.h"

namespace pagoda {
namespace {

// The dummy model in one weight type (--dtype, or --quantization on bf16 weights) and KV cache type.
struct DummyCase {
  const char* dtype;
  const char* quantization;
  KvCacheDtype kv = KvCacheDtype::kF32;
};

void PrintTo(const DummyCase& c, std::ostream* os) {
  *os << c.dtype << (*c.quantization ? " --quantization " : "") << c.quantization << ", KV cache "
      << kv_cache_dtype_name(c.kv);
}

// The SIMD kernel tables compiled in, by their PAGODA_CPU_ISA names.
std::vector<std::string> kernel_table_names() {
  std::vector<std::string> names;
  for (const cpu::CpuKernelTable& table : cpu::cpu_kernel_tables()) names.emplace_back(table.name);
  return names;
}

// A mixture of experts at the same widths (qwen3_moe: 8 experts of width 256, 2 per token), so
// every expert's weights take each type too, K-quants included, through the grouped expert
// products; the router stays f32 as llama-quantize leaves it.
constexpr const char* kMoeConfig = R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
    "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 256, "num_experts": 8,
    "num_experts_per_tok": 2, "norm_topk_prob": true, "num_hidden_layers": 2, "num_attention_heads": 8,
    "num_key_value_heads": 1, "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 512,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": false})";

using TypeAndTable = std::tuple<DummyCase, std::string>;

// The determinism suite on the dummy model of `config` in the case's type, on its kernel table.
void check_dummy(const char* config, const TypeAndTable& param) {
  PAGODA_TEST_FILE(tokenizer, "stories260K/stories260K.gguf");
  const DummyCase& c = std::get<0>(param);
  const std::string& table = std::get<1>(param);
  auto isa = cpu::parse_cpu_isa(table);
  ASSERT_TRUE(isa.ok()) << isa.status().message();
  const cpu::CpuKernelTable* t = cpu::find_cpu_kernel_table(table);
  if (t != nullptr && !t->supported(cpu::cpu_features())) {
    GTEST_SKIP() << "the CPU lacks " << t->needs << " for the " << table
                 << " kernels; it has: " << cpu::cpu_features().to_string();
  }
  const std::string dir = testing::make_temp_dir();
  ASSERT_FALSE(dir.empty());
  std::ofstream(dir + "/config.json") << config;  // rows of 256 and 512
  app::ModelFlags flags;
  flags.model = dir;
  flags.load_format = "dummy";
  flags.dtype = c.dtype;
  flags.quantization = c.quantization;
  flags.tokenizer = tokenizer;
  const int64_t head_bytes = c.kv == KvCacheDtype::kF32 ? 32 * 4 : c.kv == KvCacheDtype::kInt8 ? 32 + 4 : 32;
  determinism::check_model(flags, 2 * 2 * 1 * head_bytes, c.kv, *isa);
  std::filesystem::remove_all(dir);
}

class DeterminismDummy : public ::testing::TestWithParam<TypeAndTable> {};

TEST_P(DeterminismDummy, GroupOf8) { check_dummy(determinism::kDummyConfig, GetParam()); }

class DeterminismDummyMoe : public ::testing::TestWithParam<TypeAndTable> {};

TEST_P(DeterminismDummyMoe, EightExpertsTopTwo) { check_dummy(kMoeConfig, GetParam()); }

const auto kEveryType = ::testing::Values(
    DummyCase{"q8_0", ""}, DummyCase{"q4_0", ""}, DummyCase{"q4_1", ""}, DummyCase{"q5_0", ""}, DummyCase{"q5_1", ""},
    DummyCase{"q2_k", ""}, DummyCase{"q3_k", ""}, DummyCase{"q4_k", ""}, DummyCase{"q5_k", ""}, DummyCase{"q6_k", ""},
    DummyCase{"bfloat16", ""}, DummyCase{"bfloat16", "w8a8"}, DummyCase{"bfloat16", "w4a8"},
    DummyCase{"q8_0", "", KvCacheDtype::kInt8}, DummyCase{"q8_0", "", KvCacheDtype::kFp8E4M3});

std::string case_name(const ::testing::TestParamInfo<TypeAndTable>& info) {
  const DummyCase& c = std::get<0>(info.param);
  std::string name = std::get<1>(info.param) + "_" + c.dtype + "_" + c.quantization + "_" +
                     std::string(kv_cache_dtype_name(c.kv));
  for (char& ch : name) ch = std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(EveryType, DeterminismDummy,
                         ::testing::Combine(kEveryType, ::testing::ValuesIn(kernel_table_names())), case_name);

INSTANTIATE_TEST_SUITE_P(EveryType, DeterminismDummyMoe,
                         ::testing::Combine(kEveryType, ::testing::ValuesIn(kernel_table_names())), case_name);

}  // namespace
}  // namespace pagoda
