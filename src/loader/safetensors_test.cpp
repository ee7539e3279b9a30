#include "loader/safetensors_file.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "loader/loader_test_util.h"
#include "loader/safetensors_writer.h"
#include "support/test_data.h"
#include "tensor/half.h"

namespace pagoda {
namespace {

using testing::Bytes;
using testing::make_temp_dir;
using testing::write_test_file;
using testing::write_text_file;

// A safetensors file from a raw header text and data bytes.
std::vector<uint8_t> raw_safetensors(const std::string& header, size_t data_bytes) {
  Bytes b;
  b.u64(header.size()).raw(header).zeros(data_bytes);
  return b.b;
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  // Writes a file, opens it, expects failure with `code` naming the file and containing `needle`.
  void expect_error(const std::vector<uint8_t>& bytes, StatusCode code, const std::string& needle) {
    std::string path = write_test_file(dir_, "f" + std::to_string(n_++) + ".safetensors", bytes);
    auto r = SafetensorsFile::open(path);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status().message();
    EXPECT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(needle), std::string::npos) << r.status().message();
  }
  std::string dir_;
  int n_ = 0;
};

TEST_F(Safetensors, WriterRoundTrip) {
  SafetensorsWriter w;
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  w.add_tensor("a", DType::kF32, {2, 3}, testing::f32_bytes(a));
  std::vector<uint16_t> h = {f32_to_fp16(1.5f), f32_to_fp16(-2.0f), f32_to_fp16(0.25f)};
  w.add_tensor("h", DType::kF16, {3},
               std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(h.data()), 6));
  std::vector<uint16_t> bf = {f32_to_bf16(3.0f), f32_to_bf16(-1.0f)};
  w.add_tensor("bf", DType::kBF16, {1, 2},
               std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bf.data()), 4));
  // After 6 bytes of f16 the next f32 starts misaligned: the reader copies it.
  w.add_tensor("z", DType::kF32, {1}, testing::f32_bytes({7.0f}));
  w.add_tensor("empty", DType::kF32, {0, 4}, {});
  w.add_metadata("format", "pt");
  std::string path = dir_ + "/m.safetensors";
  ASSERT_TRUE(w.write(path).ok());

  auto r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const SafetensorsFile& f = **r;
  EXPECT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const SafetensorsTensor* ta = f.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->tensor.shape_string(), "[2, 3]");
  EXPECT_EQ(ta->tensor.as<float>()[5], 6.0f);
  // No copy for the aligned tensor: it points into the mapping.
  auto map = f.mapping();
  EXPECT_GE(static_cast<const uint8_t*>(ta->tensor.data), map->data());
  EXPECT_LT(static_cast<const uint8_t*>(ta->tensor.data), map->data() + map->size());
  EXPECT_EQ(fp16_to_f32(f.find("h")->tensor.as<uint16_t>()[0]), 1.5f);
  EXPECT_EQ(f.find("bf")->tensor.dtype, DType::kBF16);
  EXPECT_EQ(bf16_to_f32(f.find("bf")->tensor.as<uint16_t>()[1]), -1.0f);
  const Tensor& z = f.find("z")->tensor;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(z.data) % 4, 0u);
  EXPECT_EQ(z.as<float>()[0], 7.0f);
  EXPECT_EQ(f.find("empty")->tensor.numel(), 0);
  EXPECT_EQ(f.find("nope"), nullptr);
}

TEST_F(Safetensors, HeaderErrors) {
  expect_error({1, 2, 3}, StatusCode::kDataLoss, "truncated");
  Bytes b;
  b.u64(1000).raw("{}");
  expect_error(b.b, StatusCode::kDataLoss, "truncated: header of 1000 bytes");
  Bytes huge;
  huge.u64(1ull << 63).raw("{}");
  expect_error(huge.b, StatusCode::kDataLoss, "exceeds the limit");
  Bytes over;
  over.u64((100ull << 20) + 1).raw("{}");
  expect_error(over.b, StatusCode::kDataLoss, "exceeds the limit");
  expect_error(raw_safetensors("{\"a\": ", 0), StatusCode::kDataLoss, "invalid JSON");
  expect_error(raw_safetensors("[1, 2]", 0), StatusCode::kDataLoss, "not a JSON object");
  expect_error(raw_safetensors(std::string(100, '[') + std::string(100, ']'), 0), StatusCode::kDataLoss,
               "nests deeper");
  expect_error(raw_safetensors("{\"__metadata__\": 3}", 0), StatusCode::kDataLoss, "__metadata__");
}

TEST_F(Safetensors, TensorEntryErrors) {
  auto entry = [](const std::string& body) { return "{\"t\": " + body + "}"; };
  expect_error(raw_safetensors(entry("3"), 0), StatusCode::kDataLoss, "tensor t is not an object");
  expect_error(raw_safetensors(entry(R"({"shape": [1], "data_offsets": [0, 4]})"), 4),
               StatusCode::kDataLoss, "no dtype");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "data_offsets": [0, 4]})"), 4),
               StatusCode::kDataLoss, "no shape");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [0]})"), 4),
               StatusCode::kDataLoss, "data_offsets");
  expect_error(raw_safetensors(entry(R"({"dtype": "U16", "shape": [1], "data_offsets": [0, 2]})"), 2),
               StatusCode::kUnimplemented, "tensor t has unsupported dtype U16");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [1,1,1,1,1], "data_offsets": [0, 4]})"), 4),
               StatusCode::kUnimplemented, "5 dims");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})"), 4),
               StatusCode::kDataLoss, "invalid shape");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]})"), 4),
               StatusCode::kDataLoss, "invalid shape");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [4611686018427387904], "data_offsets": [0, 4]})"), 4),
               StatusCode::kDataLoss, "invalid shape");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 4]})"), 4),
               StatusCode::kDataLoss, "too many elements");
  // Offsets out of range, reversed, and a size that does not match the shape.
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [2], "data_offsets": [0, 8]})"), 4),
               StatusCode::kDataLoss, "outside the data region");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [8, 4]})"), 8),
               StatusCode::kDataLoss, "outside the data region");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [1], "data_offsets": [0, 18446744073709551615]})"), 8),
               StatusCode::kDataLoss, "invalid data_offsets");
  expect_error(raw_safetensors(entry(R"({"dtype": "F32", "shape": [3], "data_offsets": [0, 8]})"), 16),
               StatusCode::kDataLoss, "has 8 bytes of data, but shape [3] F32 needs 12");
  // A valid one for contrast.
  std::string ok_path = write_test_file(
      dir_, "ok.safetensors", raw_safetensors(entry(R"({"dtype": "F16", "shape": [2], "data_offsets": [0, 4]})"), 4));
  EXPECT_TRUE(SafetensorsFile::open(ok_path).ok());
}

// Writes two shards and an index mapping a, b to shard 1 and c to shard 2.
std::string write_sharded(const std::string& dir, const std::string& index_json) {
  SafetensorsWriter s1, s2;
  s1.add_tensor("a", DType::kF32, {1}, testing::f32_bytes({1}));
  s1.add_tensor("b", DType::kF32, {2}, testing::f32_bytes({2, 3}));
  s2.add_tensor("c", DType::kF32, {1}, testing::f32_bytes({4}));
  EXPECT_TRUE(s1.write(dir + "/model-00001-of-00002.safetensors").ok());
  EXPECT_TRUE(s2.write(dir + "/model-00002-of-00002.safetensors").ok());
  return write_text_file(dir, "model.safetensors.index.json", index_json);
}

TEST_F(Safetensors, ShardedIndex) {
  std::string index = write_sharded(dir_, R"({"metadata": {"total_size": 16}, "weight_map": {
      "a": "model-00001-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
      "c": "model-00002-of-00002.safetensors"}})");
  auto r = open_safetensors_index(index);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->tensors.size(), 3u);
  EXPECT_EQ(r->files.size(), 2u);
  EXPECT_EQ(r->tensors.at("b").as<float>()[1], 3.0f);
  EXPECT_EQ(r->tensors.at("c").as<float>()[0], 4.0f);
  auto d = open_safetensors_dir(dir_);
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(d->tensors.size(), 3u);
}

TEST_F(Safetensors, ShardedIndexErrors) {
  std::string index = write_sharded(dir_, R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "c": "model-00003-of-00002.safetensors"}})");
  auto r = open_safetensors_index(index);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model-00003-of-00002.safetensors"), std::string::npos)
      << r.status().message();

  index = write_sharded(dir_, R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
      "c": "model-00001-of-00002.safetensors"}})");
  r = open_safetensors_index(index);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("model-00001-of-00002.safetensors: missing tensor c (listed in " + index),
            std::string::npos)
      << r.status().message();

  for (const char* bad : {R"({"weight_map": {"a": "../x.safetensors"}})", R"({"weight_map": {"a": "/etc/passwd"}})",
                          R"({"weight_map": {"a": 3}})", R"({"weight_map": []})", R"({"nope": 1})", "not json"}) {
    index = write_text_file(dir_, "model.safetensors.index.json", bad);
    r = open_safetensors_index(index);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_EQ(r.status().message().rfind(index + ": ", 0), 0u) << r.status().message();
  }
  std::string empty = make_temp_dir();
  EXPECT_EQ(open_safetensors_dir(empty).status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace pagoda
