// Which QuantMethod makes each kind of projection: the checkpoint's declared method and stored
// types, and the load-time mix, decide; the first method in the registry that applies wins.
#include "model/quant/quant_method.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

constexpr int64_t kRows = 8, kCols = 64;
const std::string kName = "blk.0.attn_q.weight";

// A source holding the one projection kName as `dtype` (or, for kI32, AWQ's "qweight" in its
// place), declared as `method` quantizes it.
struct Source {
  explicit Source(DType dtype, const std::string& method = "") {
    src.path = "ckpt";
    src.weights.set_source("ckpt");
    src.config.quantization.method = method;
    std::vector<float> values(static_cast<size_t>(kRows * kCols));
    for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 13) / 13.0f - 0.5f;
    if (dtype == DType::kI32) {
      memory.assign(static_cast<size_t>(kCols * kRows / 8 * 4), 0);
      src.weights.add("blk.0.attn_q.qweight", Tensor(memory.data(), DType::kI32, {kCols, kRows / 8}));
    } else if (dtype == DType::kI8) {
      memory.assign(static_cast<size_t>(kRows * kCols), 1);
      src.weights.add(kName, Tensor(memory.data(), DType::kI8, {kRows, kCols}));
    } else {
      const int64_t row_bytes = kCols / block_elems(dtype) * block_bytes(dtype);
      memory.resize(static_cast<size_t>(row_bytes * kRows));
      for (int64_t r = 0; r < kRows; ++r) {
        quantize_row(dtype, values.data() + r * kCols, memory.data() + r * row_bytes, kCols);
      }
      src.weights.add(kName, Tensor(memory.data(), dtype, {kRows, kCols}));
    }
  }
  ModelSource src;
  std::vector<uint8_t> memory;
};

std::unique_ptr<cpu::CpuBackend> backend() {
  auto b = cpu::CpuBackend::create({.threads = 1});
  EXPECT_TRUE(b.ok());
  return std::move(*b);
}

std::string method_of(Source& s, std::optional<QuantMix> mix = std::nullopt) {
  WeightLoader w(s.src, *backend(), unsharded(s.src.config), std::move(mix));
  return std::string(quant_method_for(w, LinearRequest{kName, kRows, kCols, kName, Slice{}}).name());
}

TEST(QuantMethod, EachProjectionFindsItsMethod) {
  Source f32(DType::kF32), q4(DType::kQ4_0), i8(DType::kI8, "compressed-tensors"), awq(DType::kI32, "awq");
  EXPECT_EQ(method_of(f32), "dense");
  EXPECT_EQ(method_of(f32, uniform_mix(DType::kQ8_0)), "dense") << "a --dtype conversion is dense";
  EXPECT_EQ(method_of(f32, int_codes_mix("w8a8")), "integer codes made at load (w8a8, w4a8)");
  EXPECT_EQ(method_of(q4), "dense") << "a GGUF block type is multiplied as stored";
  EXPECT_EQ(method_of(q4, int_codes_mix("w8a8")), "dense") << "block-quantized weights are not quantized again";
  EXPECT_EQ(method_of(i8), "int8 checkpoint codes (compressed-tensors int-quantized)");
  EXPECT_EQ(method_of(awq), "packed checkpoint codes (awq, gptq, compressed-tensors)");
  Source undeclared(DType::kI32);
  EXPECT_EQ(method_of(undeclared), "dense") << "qweight without a declared method is not read as AWQ";
}

// What each method made: its type name, bytes, and whether it multiplies on int8 activations.
TEST(QuantMethod, CreatesWeightsOfItsKind) {
  const auto cpu = backend();
  struct Case {
    DType stored;
    std::optional<QuantMix> mix;
    std::string type;
    int64_t bytes;
    bool integer;
  };
  const std::vector<Case> cases = {
      {DType::kF32, std::nullopt, "f32", kRows * kCols * 4, false},
      {DType::kF32, uniform_mix(DType::kQ8_0), "q8_0", kRows * kCols / 32 * 34, false},
      {DType::kQ4_0, std::nullopt, "q4_0", kRows * kCols / 32 * 18, false},
      {DType::kF32, int_codes_mix("w8a8"), "w8a8", kRows * kCols + kRows * 4, true},
  };
  for (const Case& c : cases) {
    Source s(c.stored);
    WeightLoader w(s.src, *cpu, unsharded(s.src.config), c.mix);
    auto l = w.linear(kName, kRows, kCols);
    ASSERT_TRUE(l.ok()) << l.status().message();
    EXPECT_EQ(l->type_name(), c.type);
    EXPECT_EQ(l->weight_bytes(), c.bytes) << c.type;
    EXPECT_EQ(l->is_int(), c.integer) << c.type;
  }
}

TEST(QuantizationFlag, NamesMapToTheirKinds) {
  using Kind = QuantizationFlag::Kind;
  EXPECT_EQ(parse_quantization_flag("")->kind, Kind::kNone);
  EXPECT_EQ(parse_quantization_flag("none")->kind, Kind::kNone);
  EXPECT_EQ(parse_quantization_flag("gguf")->kind, Kind::kGguf);
  EXPECT_EQ(parse_quantization_flag("awq")->checkpoint_method, "awq");
  EXPECT_EQ(parse_quantization_flag("w8a8")->kind, Kind::kLoadMix);
  EXPECT_EQ(parse_quantization_flag("q4_k_m")->kind, Kind::kLoadMix);
  EXPECT_FALSE(parse_quantization_flag("q5_fancy").has_value());
  EXPECT_NE(quantization_flag_names().find("w4a8"), std::string::npos);
}

}  // namespace
}  // namespace pagoda
