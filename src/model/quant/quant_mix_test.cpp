// The tensor types of llama-quantize's mixes and its shape fallback, from the table in
// shared/docs/quantization-formats.md 1.6 (written out here per tensor, not computed).
#include "model/quant/quant_mix.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <iterator>
#include <string>

namespace pagoda {
namespace {

DType type_in(const char* mix, const std::string& name, int64_t num_layers, int64_t row_len = 4096,
              int64_t gqa = 4) {
  auto m = llama_file_type_mix(mix);
  EXPECT_TRUE(m.has_value()) << mix;
  return quant_mix_type(*m, WeightSlot{name, num_layers, gqa}, row_len);
}

TEST(QuantMix, Q4KMOn32Layers) {
  // use_more_bits(i, 32): i < 4, i >= 28, or (i - 4) % 3 == 2: layers 0-3, 6, 9, ..., 27, 28-31.
  const int more[] = {0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31};
  for (int i = 0; i < 32; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    const bool more_bits = std::find(std::begin(more), std::end(more), i) != std::end(more);
    EXPECT_EQ(type_in("q4_k_m", p + "attn_v.weight", 32), more_bits ? DType::kQ6_K : DType::kQ4_K) << i;
    EXPECT_EQ(type_in("q4_k_m", p + "ffn_down.weight", 32), more_bits ? DType::kQ6_K : DType::kQ4_K) << i;
    EXPECT_EQ(type_in("q4_k_m", p + "attn_q.weight", 32), DType::kQ4_K);
    EXPECT_EQ(type_in("q4_k_m", p + "attn_output.weight", 32), DType::kQ4_K);
    EXPECT_EQ(type_in("q4_k_m", p + "ffn_up.weight", 32), DType::kQ4_K);
  }
  EXPECT_EQ(type_in("q4_k_m", "output.weight", 32), DType::kQ6_K);
  EXPECT_EQ(type_in("q4_k_m", "token_embd.weight", 32), DType::kQ4_K);  // untied: the base type
}

// A mixture of experts: each expert's and the shared expert's down projection follow the
// ffn_down rule; the router and the shared expert's gate stay f32 in every mix.
TEST(QuantMix, ExpertsAndRouters) {
  EXPECT_EQ(type_in("q4_k_m", "blk.0.ffn_down.17.weight", 48), DType::kQ6_K);
  EXPECT_EQ(type_in("q4_k_m", "blk.7.ffn_down.17.weight", 48), DType::kQ4_K);
  EXPECT_EQ(type_in("q4_k_m", "blk.0.ffn_down_shexp.weight", 48), DType::kQ6_K);
  EXPECT_EQ(type_in("q4_k_m", "blk.7.ffn_gate.3.weight", 48), DType::kQ4_K);
  for (const char* mix : {"q4_k_m", "q8_0", "q4_0"}) {
    EXPECT_EQ(type_in(mix, "blk.7.ffn_gate_inp.weight", 48), DType::kF32) << mix;
    EXPECT_EQ(type_in(mix, "blk.7.ffn_gate_inp_shexp.weight", 48), DType::kF32) << mix;
  }
  EXPECT_EQ(quant_mix_type(uniform_mix(DType::kQ4_0), WeightSlot{"blk.1.ffn_gate_inp.weight", 4, 1}, 2048), DType::kF32);
  EXPECT_FALSE(quant_mix_int_codes(*int_codes_mix("w8a8"), WeightSlot{"blk.1.ffn_gate_inp.weight", 4, 1}));
  EXPECT_TRUE(quant_mix_int_codes(*int_codes_mix("w8a8"), WeightSlot{"blk.1.ffn_up.2.weight", 4, 1}));
}

TEST(QuantMix, OtherKMixes) {
  // Q5_K_M: Q6_K where use_more_bits, else Q5_K; attn_output Q5_K.
  EXPECT_EQ(type_in("q5_k_m", "blk.0.attn_v.weight", 22), DType::kQ6_K);
  EXPECT_EQ(type_in("q5_k_m", "blk.3.ffn_down.weight", 22), DType::kQ5_K);   // 22 / 8 = 2; (3 - 2) % 3 = 1
  EXPECT_EQ(type_in("q5_k_m", "blk.4.ffn_down.weight", 22), DType::kQ6_K);   // (4 - 2) % 3 = 2
  EXPECT_EQ(type_in("q5_k_m", "blk.19.ffn_down.weight", 22), DType::kQ6_K);  // 19 >= 7 * 22 / 8 = 19
  EXPECT_EQ(type_in("q5_k_m", "blk.5.attn_output.weight", 22), DType::kQ5_K);
  EXPECT_EQ(type_in("q5_k_m", "blk.5.ffn_gate.weight", 22), DType::kQ5_K);
  // Q3_K_M: attn_v Q5_K for the first two, then Q4_K; ffn_down Q5_K for i < n / 16; attn_output Q4_K.
  EXPECT_EQ(type_in("q3_k_m", "blk.1.attn_v.weight", 32), DType::kQ5_K);
  EXPECT_EQ(type_in("q3_k_m", "blk.2.attn_v.weight", 32), DType::kQ4_K);
  EXPECT_EQ(type_in("q3_k_m", "blk.1.ffn_down.weight", 32), DType::kQ5_K);
  EXPECT_EQ(type_in("q3_k_m", "blk.2.ffn_down.weight", 32), DType::kQ4_K);
  EXPECT_EQ(type_in("q3_k_m", "blk.9.attn_output.weight", 32), DType::kQ4_K);
  EXPECT_EQ(type_in("q3_k_m", "blk.9.attn_k.weight", 32), DType::kQ3_K);
  // Q2_K: attn_v Q4_K with a GQA group of 4 or more, else Q3_K; ffn_down and attn_output Q3_K.
  EXPECT_EQ(type_in("q2_k", "blk.0.attn_v.weight", 32, 4096, 8), DType::kQ4_K);
  EXPECT_EQ(type_in("q2_k", "blk.0.attn_v.weight", 32, 4096, 1), DType::kQ3_K);
  EXPECT_EQ(type_in("q2_k", "blk.0.ffn_down.weight", 32), DType::kQ3_K);
  EXPECT_EQ(type_in("q2_k", "blk.0.ffn_up.weight", 32), DType::kQ2_K);
  EXPECT_EQ(type_in("q2_k", "output.weight", 32), DType::kQ6_K);
}

TEST(QuantMix, LegacyFileTypesRaiseOnlyTheOutput) {
  for (const char* mix : {"q4_0", "q4_1", "q5_0", "q5_1", "q6_k"}) {
    const DType base = *dtype_from_name(mix);
    EXPECT_EQ(type_in(mix, "blk.0.attn_v.weight", 32), base) << mix;
    EXPECT_EQ(type_in(mix, "blk.0.ffn_down.weight", 32), base) << mix;
    EXPECT_EQ(type_in(mix, "output.weight", 32), DType::kQ6_K) << mix;
  }
  EXPECT_EQ(type_in("q8_0", "output.weight", 32), DType::kQ8_0);  // already higher
  EXPECT_EQ(type_in("q8_0", "blk.0.ffn_down.weight", 32), DType::kQ8_0);
  EXPECT_FALSE(llama_file_type_mix("q4_k").has_value());  // a tensor type, not a file type
  EXPECT_FALSE(llama_file_type_mix("awq").has_value());
}

TEST(QuantMix, ShapeFallback) {
  // Rows of 4864 (Qwen2.5-0.5B's ffn_down: 19 x 256): whole super-blocks, nothing changes.
  EXPECT_EQ(type_in("q4_k_m", "blk.1.ffn_up.weight", 24, 4864), DType::kQ4_K);
  // Rows of 896 (its hidden size: 3.5 super-blocks, 28 blocks of 32).
  EXPECT_EQ(dtype_for_rows(DType::kQ2_K, 896), DType::kQ4_0);
  EXPECT_EQ(dtype_for_rows(DType::kQ3_K, 896), DType::kQ4_0);
  EXPECT_EQ(dtype_for_rows(DType::kQ4_K, 896), DType::kQ5_0);
  EXPECT_EQ(dtype_for_rows(DType::kQ5_K, 896), DType::kQ5_1);
  EXPECT_EQ(dtype_for_rows(DType::kQ6_K, 896), DType::kQ8_0);
  EXPECT_EQ(type_in("q4_k_m", "output.weight", 24, 896), DType::kQ8_0);
  // Rows of 172 (stories260K's ffn_down): not whole 32-element blocks either: f16.
  for (DType t : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ6_K}) EXPECT_EQ(dtype_for_rows(t, 172), DType::kF16);
  // Plain types never fall back.
  EXPECT_EQ(dtype_for_rows(DType::kBF16, 7), DType::kBF16);
  EXPECT_EQ(quant_mix_type(uniform_mix(DType::kQ4_K), WeightSlot{"output.weight", 1, 1}, 512), DType::kQ4_K);
}

TEST(QuantMix, IntCodesTakeTheLayersProjectionsOnly) {
  const auto w8 = int_codes_mix("w8a8"), w4 = int_codes_mix("w4a8");
  ASSERT_TRUE(w8 && w4);
  EXPECT_EQ(w8->int_bits, 8);
  EXPECT_EQ(w4->int_bits, 4);
  EXPECT_FALSE(int_codes_mix("w8a16").has_value());
  for (const char* name : {"blk.0.attn_q.weight", "blk.7.ffn_down.weight", "blk.12.attn_output.weight"}) {
    EXPECT_TRUE(quant_mix_int_codes(*w8, WeightSlot{name, 16, 1})) << name;
  }
  for (const char* name : {"output.weight", "token_embd.weight"}) {
    EXPECT_FALSE(quant_mix_int_codes(*w8, WeightSlot{name, 16, 1})) << name;
  }
  EXPECT_FALSE(quant_mix_int_codes(*llama_file_type_mix("q8_0"), WeightSlot{"blk.0.attn_q.weight", 16, 1}));
  // W8A8: one scale per output channel. W4A8: groups of 128, else 64 or 32, else per channel.
  EXPECT_EQ(quant_mix_int_group(*w8, 2048), 2048);
  EXPECT_EQ(quant_mix_int_group(*w4, 2048), 128);
  EXPECT_EQ(quant_mix_int_group(*w4, 896), 128);  // 7 x 128
  EXPECT_EQ(quant_mix_int_group(*w4, 4864), 128);
  EXPECT_EQ(quant_mix_int_group(*w4, 64), 64);
  EXPECT_EQ(quant_mix_int_group(*w4, 96), 96);    // not a multiple of 128: per channel
  EXPECT_EQ(quant_mix_int_group(*w4, 576), 576);
  EXPECT_EQ(quant_mix_int_group(*w4, 172), 172);
}

}  // namespace
}  // namespace pagoda
