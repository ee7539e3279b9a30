// The packed checkpoint layouts of shared/docs/quantization-formats.md 2-4, each checked on words
// written by hand here, with the weights they mean worked out by hand from the format's
// dequantization formula (not by a writer of ours).
#include "model/quant/packed_linear.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <functional>
#include <limits>

#include "loader/packed_names.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

class PackedLinear : public ::testing::Test {
 protected:
  void SetUp() override { weights_.set_source("ckpt"); }

  void i32(const std::string& name, std::initializer_list<int64_t> shape, std::vector<uint32_t> words) {
    store(name, DType::kI32, shape, words.data(), words.size() * 4);
  }
  void i64(const std::string& name, std::vector<int64_t> values) {
    store(name, DType::kI64, {static_cast<int64_t>(values.size())}, values.data(), values.size() * 8);
  }
  void f16(const std::string& name, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
    std::vector<uint16_t> h(values.size());
    quantize_row(DType::kF16, values.data(), h.data(), static_cast<int64_t>(values.size()));
    store(name, DType::kF16, shape, h.data(), h.size() * 2);
  }
  void bf16(const std::string& name, std::initializer_list<int64_t> shape, const std::vector<float>& values) {
    std::vector<uint16_t> h(values.size());
    quantize_row(DType::kBF16, values.data(), h.data(), static_cast<int64_t>(values.size()));
    store(name, DType::kBF16, shape, h.data(), h.size() * 2);
  }

  Result<IntCodes> read(const std::string& weight, int64_t n, int64_t k) {
    return read_packed_linear(weights_, weight, n, k, q_);
  }

  // The weight (j, t) of input column t as the codes say: scale * (code - zero) of the column's
  // place after any reordering.
  static float value(const IntCodes& c, int64_t j, int64_t t) {
    int64_t at = t;
    if (!c.perm.empty()) at = std::find(c.perm.begin(), c.perm.end(), t) - c.perm.begin();
    const int64_t g = at / c.group_size;
    int code;
    if (c.bits == 8) {
      code = static_cast<int8_t>(c.codes[static_cast<size_t>(j * c.k + at)]);
    } else {
      const uint8_t byte = c.codes[static_cast<size_t>(j * c.k / 2 + at / 2)];
      const int nib = (byte >> (4 * (at % 2))) & 0xF;
      code = nib >= 8 ? nib - 16 : nib;
    }
    const int32_t zero = c.zero_points.empty() ? 0 : c.zero_points[static_cast<size_t>(j * c.groups() + g)];
    return c.scales[static_cast<size_t>(j * c.groups() + g)] * static_cast<float>(code - zero);
  }

  void expect_weights(const IntCodes& c, const std::function<float(int64_t, int64_t)>& want) {
    for (int64_t j = 0; j < c.n; ++j) {
      for (int64_t t = 0; t < c.k; ++t) EXPECT_EQ(value(c, j, t), want(j, t)) << "output " << j << " input " << t;
    }
  }

  void expect_error(const std::string& weight, int64_t n, int64_t k, const std::string& message) {
    auto r = read(weight, n, k);
    ASSERT_FALSE(r.ok()) << message;
    EXPECT_NE(r.status().message().find(message), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().rfind("ckpt: tensor ", 0), 0u) << r.status().message();
  }

  WeightMap weights_;
  CheckpointQuantization q_;

 private:
  void store(const std::string& name, DType t, std::initializer_list<int64_t> shape, const void* bytes, size_t size) {
    data_.emplace_back(size);
    std::memcpy(data_.back().data(), bytes, size);
    weights_.add(name, Tensor(data_.back().data(), t, shape));
  }
  std::deque<std::vector<uint8_t>> data_;
};

// AWQ GEMM: qweight [k, n / 8], slots 0..7 of a word (LSB first) hold outputs 0, 2, 4, 6, 1, 3, 5,
// 7; qzeros packed the same way; w = (q - z) * s with the real zero.
TEST_F(PackedLinear, AwqGemmInterleave) {
  q_.method = "awq";
  q_.bits = 4;
  q_.group_size = 8;
  q_.symmetric = false;
  // Input 0: slots hold 0..7; inputs 1..7: every code 15.
  i32("blk.0.attn_q.qweight", {8, 1}, {0x76543210, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF,
                                       0xFFFFFFFF, 0xFFFFFFFF});
  i32("blk.0.attn_q.qzeros", {1, 1}, {0x11111118});  // output 0 (slot 0): 8; the others 1
  f16("blk.0.attn_q.scales", {1, 8}, {0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f, 4});
  EXPECT_TRUE(has_packed_linear(weights_, "blk.0.attn_q.weight", q_));
  EXPECT_FALSE(has_packed_linear(weights_, "blk.0.attn_k.weight", q_));
  auto c = read("blk.0.attn_q.weight", 8, 8);
  ASSERT_TRUE(c.ok()) << c.status().message();
  // Input 0, by output: codes 0, 4, 1, 5, 2, 6, 3, 7 (slot of output j is 0, 4, 1, 5, 2, 6, 3, 7).
  const float input0[8] = {(0 - 8) * 0.5f, (4 - 1) * 1.0f, (1 - 1) * 1.5f, (5 - 1) * 2.0f,
                           (2 - 1) * 2.5f, (6 - 1) * 3.0f, (3 - 1) * 3.5f, (7 - 1) * 4.0f};
  expect_weights(*c, [&](int64_t j, int64_t t) {
    if (t == 0) return input0[j];
    return j == 0 ? (15 - 8) * 0.5f : (15 - 1) * (0.5f * static_cast<float>(j + 1));
  });
  EXPECT_FALSE(c->zero_points.empty());
  EXPECT_TRUE(c->perm.empty());

  // Bad input: missing zeros, shapes, a non-finite scale.
  weights_.add("blk.0.attn_k.qweight", *weights_.find("blk.0.attn_q.qweight"));
  expect_error("blk.0.attn_k.weight", 8, 8, "tensor blk.0.attn_k.qzeros is missing");
  expect_error("blk.0.attn_q.weight", 16, 8, "blk.0.attn_q.qweight (awq projection blk.0.attn_q.weight) has shape [8, 1], expected [8, 2]");
  f16("blk.0.attn_q.scales", {1, 8}, {0.5f, 1, 1.5f, 2, 2.5f, 3, 3.5f, std::numeric_limits<float>::infinity()});
  expect_error("blk.0.attn_q.weight", 8, 8, "blk.0.attn_q.scales (awq projection blk.0.attn_q.weight) has a scale that is not finite");
  q_.group_size = 16;
  expect_error("blk.0.attn_q.weight", 8, 24, "24 input columns, not a multiple of 8 and of the group size 16");
}

// GPTQ 4-bit with act-order: qweight [k / 8, n] packs inputs; qzeros [groups, n / 8] packs outputs,
// v1 stores zero - 1; g_idx assigns inputs to groups out of order.
TEST_F(PackedLinear, Gptq4BitActOrderV1AndV2) {
  q_.method = "gptq";
  q_.bits = 4;
  q_.group_size = 8;
  q_.symmetric = false;
  q_.act_order = true;
  q_.zeros_minus_one = true;
  // Input t has code t (0..15) in every output.
  std::vector<uint32_t> qw(16);
  for (int j = 0; j < 8; ++j) {
    qw[static_cast<size_t>(j)] = 0x76543210;
    qw[static_cast<size_t>(8 + j)] = 0xFEDCBA98;
  }
  i32("blk.1.ffn_up.qweight", {2, 8}, qw);
  // Group 0: every zero stored 7 (real 8); group 1: output 0 stored 5 (real 6), the others 3 (4).
  i32("blk.1.ffn_up.qzeros", {2, 1}, {0x77777777, 0x33333335});
  f16("blk.1.ffn_up.scales", {2, 8}, {1, 1, 1, 1, 1, 1, 1, 1, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f, 0.25f});
  std::vector<uint32_t> g_idx(16);
  for (int t = 0; t < 16; ++t) g_idx[static_cast<size_t>(t)] = static_cast<uint32_t>(t % 2);  // even: 0, odd: 1
  i32("blk.1.ffn_up.g_idx", {16}, g_idx);
  auto c = read("blk.1.ffn_up.weight", 8, 16);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_EQ(c->perm.size(), 16u);
  EXPECT_EQ(c->perm[0], 0);
  EXPECT_EQ(c->perm[1], 2);
  EXPECT_EQ(c->perm[8], 1);  // group 1 starts with the first odd input
  const auto v1 = [](int64_t j, int64_t t) {
    const auto code = static_cast<float>(t);
    if (t % 2 == 0) return (code - 8) * 1.0f;
    return (code - (j == 0 ? 6.0f : 4.0f)) * 0.25f;
  };
  expect_weights(*c, v1);

  q_.zeros_minus_one = false;  // gptq_v2: the zeros as stored
  c = read("blk.1.ffn_up.weight", 8, 16);
  ASSERT_TRUE(c.ok()) << c.status().message();
  expect_weights(*c, [](int64_t j, int64_t t) {
    const auto code = static_cast<float>(t);
    if (t % 2 == 0) return (code - 7) * 1.0f;
    return (code - (j == 0 ? 5.0f : 3.0f)) * 0.25f;
  });

  // Bad g_idx: out of range, and groups of unequal size.
  g_idx[3] = 2;
  i32("blk.1.ffn_up.g_idx", {16}, g_idx);
  expect_error("blk.1.ffn_up.weight", 8, 16, "blk.1.ffn_up.g_idx (gptq projection blk.1.ffn_up.weight) puts input 3 in group 2, out of range [0, 2)");
  g_idx[3] = 0;
  i32("blk.1.ffn_up.g_idx", {16}, g_idx);
  expect_error("blk.1.ffn_up.weight", 8, 16, "puts 9 inputs in group 0, expected the group size 8");
}

// GPTQ 8-bit symmetric per channel: 4 bytes per word along the inputs; v1's 0x7F7F7F7F zeros
// are 128, so w = (q - 128) * s, including the code 0 (-128 after the offset).
TEST_F(PackedLinear, Gptq8BitSymmetricPerChannel) {
  q_.method = "gptq";
  q_.bits = 8;
  q_.group_size = 0;
  q_.zeros_minus_one = true;
  i32("blk.0.attn_v.qweight", {2, 4}, {0x80FF0100, 0x80FF0100, 0x80FF0100, 0x80FF0100, 0x7F7F7F7F, 0x7F7F7F7F,
                                       0x7F7F7F7F, 0x7F7F7F7F});
  i32("blk.0.attn_v.qzeros", {1, 1}, {0x7F7F7F7F});
  bf16("blk.0.attn_v.scales", {1, 4}, {2, 2, 2, 0.5f});
  auto c = read("blk.0.attn_v.weight", 4, 8);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_TRUE(c->zero_points.empty());  // all zero once offset: the symmetric product
  EXPECT_EQ(c->group_size, 8);
  const float codes[8] = {0, 1, 255, 128, 127, 127, 127, 127};  // inputs 0..3 from 0x80FF0100
  expect_weights(*c, [&](int64_t j, int64_t t) { return (codes[t] - 128) * (j == 3 ? 0.5f : 2.0f); });
}

// compressed-tensors pack-quantized W4A16: weight_packed [n, k / 8] along the inputs, stored as
// code + 8; weight_scale [n, groups]; asymmetric zero points packed along the outputs.
TEST_F(PackedLinear, CompressedTensorsPackQuantized) {
  q_.method = "compressed-tensors";
  q_.format = "pack-quantized";
  q_.bits = 4;
  q_.group_size = 8;
  // Row 0: inputs 0..7 stored 7..0 (codes -1..-8), inputs 8..15 stored 15..8 (codes 7..0); row 1:
  // every input stored 8 (code 0).
  i32("blk.0.ffn_down.weight_packed", {2, 2}, {0x01234567, 0x89ABCDEF, 0x88888888, 0x88888888});
  bf16("blk.0.ffn_down.weight_scale", {2, 2}, {2, 0.5f, 1, 1});
  i64("blk.0.ffn_down.weight_shape", {2, 16});
  EXPECT_TRUE(has_packed_linear(weights_, "blk.0.ffn_down.weight", q_));
  auto c = read("blk.0.ffn_down.weight", 2, 16);
  ASSERT_TRUE(c.ok()) << c.status().message();
  const auto sym = [](int64_t j, int64_t t) {
    if (j == 1) return 0.0f;
    return t < 8 ? static_cast<float>(-1 - t) * 2 : static_cast<float>(7 - (t - 8)) * 0.5f;
  };
  expect_weights(*c, sym);

  // Asymmetric: zero points [ceil(2 / 8), 2] int32, output j in slot j, stored zero + 8.
  q_.symmetric = false;
  i32("blk.0.ffn_down.weight_zero_point", {1, 2}, {0xA9, 0x88});  // group 0: row 0 zero 1, row 1 zero 2
  c = read("blk.0.ffn_down.weight", 2, 16);
  ASSERT_TRUE(c.ok()) << c.status().message();
  expect_weights(*c, [&](int64_t j, int64_t t) {
    if (t >= 8) return sym(j, t);
    return j == 0 ? static_cast<float>(-1 - t - 1) * 2 : -2.0f;
  });

  // The same zero points as int8 values, one per (output, group), unpacked and without offset.
  std::vector<uint8_t> zp_i8 = {1, 0, 2, 0};  // [2, 2]: row 0 group 0: 1; row 1 group 0: 2
  weights_.add("blk.0.ffn_down.weight_zero_point", Tensor(zp_i8.data(), DType::kI8, {2, 2}));
  c = read("blk.0.ffn_down.weight", 2, 16);
  ASSERT_TRUE(c.ok()) << c.status().message();
  expect_weights(*c, [&](int64_t j, int64_t t) {
    if (t >= 8) return sym(j, t);
    return j == 0 ? static_cast<float>(-1 - t - 1) * 2 : -2.0f;
  });

  i64("blk.0.ffn_down.weight_shape", {2, 32});
  expect_error("blk.0.ffn_down.weight", 2, 16, "weight_shape (compressed-tensors projection blk.0.ffn_down.weight) says [2, 32], expected [2, 16]");
  i64("blk.0.ffn_down.weight_shape", {2, 16});
  bf16("blk.0.ffn_down.weight_scale", {2, 1}, {2, 1});
  expect_error("blk.0.ffn_down.weight", 2, 16, "weight_scale (compressed-tensors projection blk.0.ffn_down.weight) has shape [2, 1], expected [2, 2]");
}

}  // namespace
}  // namespace pagoda
