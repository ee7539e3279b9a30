#include "loader/gguf_file.h"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <filesystem>

#include "loader/gguf_writer.h"
#include "loader/loader_test_util.h"
#include "support/test_data.h"
#include "tensor/convert.h"

namespace pagoda {
namespace {

using testing::Bytes;
using testing::make_temp_dir;
using testing::write_test_file;

constexpr uint32_t kMagic = 0x46554747;

// ---- real files ----------------------------------------------------------------------------

TEST(GgufFile, Stories260K) {
  PAGODA_TEST_FILE(path, "stories260K/stories260K.gguf");
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const GgufFile& g = **r;
  EXPECT_EQ(g.path(), path);
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.alignment(), 32u);
  EXPECT_EQ(g.tensors().size(), 48u);
  EXPECT_EQ(g.metadata().size(), 19u);
  EXPECT_EQ(g.data_offset(), 14176u);

  EXPECT_EQ(*g.get_string("general.architecture"), "llama");
  EXPECT_EQ(*g.get_int("llama.block_count"), 5);
  EXPECT_EQ(*g.get_int("tokenizer.ggml.seperator_token_id"), 0xffffffffll);  // uint32, fits
  EXPECT_NEAR(*g.get_float("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-9);
  EXPECT_EQ(*g.get_float("llama.block_count"), 5.0);  // integers read as floats too

  auto tokens = g.get_string_array("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(tokens->size(), 512u);
  EXPECT_EQ((*tokens)[1], "<s>");
  EXPECT_EQ((*tokens)[3], "<0x00>");
  auto scores = g.get_float_array("tokenizer.ggml.scores");
  ASSERT_TRUE(scores.ok());
  EXPECT_EQ(scores->size(), 512u);
  auto types = g.get_int_array("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  ASSERT_EQ(types->size(), 512u);
  EXPECT_EQ((*types)[1], 3);
  EXPECT_EQ((*types)[3], 6);

  // Getter errors name the path and the key.
  auto missing = g.get_int("llama.nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), path + ": missing metadata key llama.nope");
  auto wrong = g.get_int("general.architecture");
  EXPECT_EQ(wrong.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(wrong.status().message().find("general.architecture has type string"), std::string::npos);
  EXPECT_FALSE(g.get_string_array("tokenizer.ggml.scores").ok());
  EXPECT_FALSE(g.get_int_array("tokenizer.ggml.scores").ok());
  EXPECT_FALSE(g.get_bool("llama.block_count").ok());

  const GgufTensorInfo* embd = g.find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->tensor.shape_string(), "[512, 64]");
  EXPECT_EQ(embd->tensor.dtype, DType::kF32);
  const GgufTensorInfo* down = g.find_tensor("blk.4.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->tensor.shape_string(), "[64, 172]");
  EXPECT_EQ(g.find_tensor("blk.5.ffn_down.weight"), nullptr);

  // No copies: every tensor points into the mapping, inside the data section.
  auto map = g.mapping();
  for (const GgufTensorInfo& t : g.tensors()) {
    auto* p = static_cast<const uint8_t*>(t.tensor.data);
    EXPECT_EQ(p, map->data() + g.data_offset() + t.offset) << t.name;
    EXPECT_LE(p + t.tensor.nbytes(), map->data() + map->size()) << t.name;
  }
  // The last tensor ends exactly at the end of the file.
  uint64_t end = 0;
  for (const GgufTensorInfo& t : g.tensors()) {
    end = std::max<uint64_t>(end, g.data_offset() + t.offset + t.tensor.nbytes());
  }
  EXPECT_EQ(end, map->size());
}

TEST(GgufFile, VocabOnlyFilesHaveNoTensorsAndNoPadding) {
  struct Case {
    const char* file;
    size_t num_tokens;
  };
  for (Case c : {Case{"vocab/ggml-vocab-llama-spm.gguf", 32000}, Case{"vocab/ggml-vocab-gpt-2.gguf", 50257}}) {
    PAGODA_TEST_FILE(path, c.file);
    auto r = GgufFile::open(path);
    ASSERT_TRUE(r.ok()) << r.status().message();
    const GgufFile& g = **r;
    EXPECT_TRUE(g.tensors().empty());
    EXPECT_NE(g.mapping()->size() % 32, 0u) << "expected an unpadded file";
    auto tokens = g.get_string_array("tokenizer.ggml.tokens");
    ASSERT_TRUE(tokens.ok());
    EXPECT_EQ(tokens->size(), c.num_tokens);
  }
  PAGODA_TEST_FILE(gpt2, "vocab/ggml-vocab-gpt-2.gguf");
  auto g = GgufFile::open(gpt2);
  ASSERT_TRUE(g.ok());
  auto merges = (*g)->get_string_array("tokenizer.ggml.merges");
  ASSERT_TRUE(merges.ok());
  EXPECT_EQ(merges->size(), 50000u);
  EXPECT_EQ(*(*g)->get_string("tokenizer.ggml.model"), "gpt2");
}

TEST(GgufFile, MissingFileIsNotFound) {
  auto r = GgufFile::open("/nonexistent/file.gguf");
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

// ---- writer round trip ---------------------------------------------------------------------

TEST(GgufWriter, RoundTripsMetadataAndTensors) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("a.u32", 7);
  w.add_i32("a.i32", -5);
  w.add_f32("a.f32", 0.25f);
  w.add_bool("a.bool", true);
  w.add_u64("a.u64", 1ull << 40);
  w.add_string_array("a.strs", {"x", "", "hello"});
  w.add_f32_array("a.f32s", {1.5f, -2.0f});
  w.add_i32_array("a.i32s", {3, -4, 5});

  std::vector<float> values(2 * 64);
  for (size_t i = 0; i < values.size(); ++i) values[i] = std::sin(static_cast<float>(i));
  std::vector<std::pair<DType, std::vector<uint8_t>>> stored;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    std::vector<uint8_t> bytes(*dtype_bytes(t, values.size()));
    for (int r = 0; r < 2; ++r) {
      quantize_row(t, values.data() + r * 64, bytes.data() + r * bytes.size() / 2, 64);
    }
    w.add_tensor("t." + std::string(dtype_name(t)), t, {2, 64}, bytes);
    stored.emplace_back(t, std::move(bytes));
  }
  std::vector<float> vec = {1, 2, 3};
  w.add_tensor("vec", DType::kF32, {3}, testing::f32_bytes(vec));

  std::string dir = make_temp_dir();
  std::string path = dir + "/w.gguf";
  ASSERT_TRUE(w.write(path).ok());
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const GgufFile& g = **r;
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.metadata().size(), 9u);
  EXPECT_EQ(*g.get_string("general.architecture"), "llama");
  EXPECT_EQ(*g.get_int("a.u32"), 7);
  EXPECT_EQ(*g.get_int("a.i32"), -5);
  EXPECT_EQ(*g.get_float("a.f32"), 0.25);
  EXPECT_EQ(*g.get_bool("a.bool"), true);
  EXPECT_EQ(*g.get_int("a.u64"), int64_t{1} << 40);
  EXPECT_EQ(*g.get_string_array("a.strs"), (std::vector<std::string_view>{"x", "", "hello"}));
  EXPECT_EQ(*g.get_float_array("a.f32s"), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(*g.get_int_array("a.i32s"), (std::vector<int64_t>{3, -4, 5}));
  EXPECT_EQ(g.find("a.u32")->type, GgufType::kUint32);

  ASSERT_EQ(g.tensors().size(), 6u);
  for (const auto& [t, bytes] : stored) {
    const GgufTensorInfo* info = g.find_tensor("t." + std::string(dtype_name(t)));
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->tensor.dtype, t);
    EXPECT_EQ(info->tensor.shape_string(), "[2, 64]");
    ASSERT_EQ(static_cast<size_t>(info->tensor.nbytes()), bytes.size());
    EXPECT_EQ(std::memcmp(info->tensor.data, bytes.data(), bytes.size()), 0);
    EXPECT_EQ(info->offset % 32, 0u);
  }
  EXPECT_EQ(g.find_tensor("vec")->tensor.shape_string(), "[3]");
  EXPECT_EQ(g.find_tensor("vec")->tensor.as<float>()[2], 3.0f);

  // A writer with no tensors makes an unpadded vocab-style file that opens.
  GgufWriter vocab;
  vocab.add_string("k", "abc");
  ASSERT_TRUE(vocab.write(dir + "/v.gguf").ok());
  EXPECT_EQ(std::filesystem::file_size(dir + "/v.gguf"), 24u + 8 + 1 + 4 + 8 + 3);
  EXPECT_TRUE(GgufFile::open(dir + "/v.gguf").ok());
}

// ---- handcrafted bad files (the categories of llama.cpp's test-gguf) ------------------------

// A small GGUF assembled from parts: header, metadata bytes, tensor info bytes, data.
struct Crafted {
  uint32_t magic = kMagic;
  uint32_t version = 3;
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  Bytes kv;
  Bytes infos;
  uint64_t alignment = 32;
  Bytes data;
  bool pad = true;

  std::vector<uint8_t> build() const {
    Bytes out;
    out.u32(magic).u32(version).u64(n_tensors).u64(n_kv).append(kv).append(infos);
    if (pad) out.pad_to(alignment);
    out.append(data);
    return out.b;
  }
};

void add_kv_u32(Crafted* c, std::string_view key, uint32_t v) {
  c->kv.str(key).u32(static_cast<uint32_t>(GgufType::kUint32)).u32(v);
  ++c->n_kv;
}
void add_kv_str(Crafted* c, std::string_view key, std::string_view v) {
  c->kv.str(key).u32(static_cast<uint32_t>(GgufType::kString)).str(v);
  ++c->n_kv;
}
// dims in GGUF order (innermost first).
void add_info(Crafted* c, std::string_view name, std::vector<uint64_t> dims, uint32_t type,
              uint64_t offset) {
  c->infos.str(name).u32(static_cast<uint32_t>(dims.size()));
  for (uint64_t d : dims) c->infos.u64(d);
  c->infos.u32(type).u64(offset);
  ++c->n_tensors;
}

// A valid file: one string KV, tensors a [4] f32 at 0 and b [8 x 2] f32 at 32.
Crafted valid_crafted() {
  Crafted c;
  add_kv_str(&c, "general.architecture", "llama");
  add_info(&c, "a", {4}, 0, 0);
  add_info(&c, "b", {8, 2}, 0, 32);
  c.data.zeros(32 + 64);
  return c;
}

class GgufCrafted : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = make_temp_dir(); }
  // Opens the crafted bytes; returns the status.
  Status open(const Crafted& c) { return open_bytes(c.build()); }
  Status open_bytes(const std::vector<uint8_t>& bytes) {
    std::string path = write_test_file(dir_, "f" + std::to_string(n_++) + ".gguf", bytes);
    auto r = GgufFile::open(path);
    if (!r.ok()) {
      // Every error names the file first.
      EXPECT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << r.status().message();
    }
    return r.status();
  }
  // Expects failure with `code` and a message containing `needle`.
  void expect_error(const Crafted& c, StatusCode code, const std::string& needle) {
    Status s = open(c);
    EXPECT_EQ(s.code(), code) << s.message();
    EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message();
  }
  std::string dir_;
  int n_ = 0;
};

TEST_F(GgufCrafted, ValidBaselineOpens) {
  Status s = open(valid_crafted());
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST_F(GgufCrafted, VersionTwoOpens) {
  Crafted c = valid_crafted();
  c.version = 2;
  EXPECT_TRUE(open(c).ok());
}

TEST_F(GgufCrafted, HeaderErrors) {
  Crafted c = valid_crafted();
  c.magic = 0x46554746;
  expect_error(c, StatusCode::kDataLoss, "bad magic");
  c = valid_crafted();
  c.version = 1;
  expect_error(c, StatusCode::kUnimplemented, "version 1");
  c.version = 4;
  expect_error(c, StatusCode::kUnimplemented, "version 4");
  c.version = 0x03000000;
  expect_error(c, StatusCode::kUnimplemented, "big-endian");
  c = valid_crafted();
  c.n_tensors = ~0ull;  // -1
  expect_error(c, StatusCode::kDataLoss, "truncated");
  c = valid_crafted();
  c.n_kv = ~0ull;
  expect_error(c, StatusCode::kDataLoss, "truncated");
  c = valid_crafted();
  c.n_kv = 1ull << 40;
  expect_error(c, StatusCode::kDataLoss, "truncated");
  EXPECT_FALSE(open_bytes({}).ok());
  EXPECT_FALSE(open_bytes({'G', 'G', 'U', 'F', 3, 0}).ok());
}

TEST_F(GgufCrafted, MetadataErrors) {
  Crafted c = valid_crafted();
  c.kv = Bytes();
  c.kv.u64(1ull << 63).raw("general.architecture");  // key length huge
  expect_error(c, StatusCode::kDataLoss, "metadata key 0 has length");
  c.kv = Bytes();
  c.kv.u64(65000).raw("short");  // key longer than the file
  expect_error(c, StatusCode::kDataLoss, "truncated: metadata key 0 ends past the end of the file");
  c.kv = Bytes();
  c.kv.str("k").u32(13).u32(0);  // bad value type
  expect_error(c, StatusCode::kDataLoss, "invalid value type 13");
  c.kv = Bytes();
  c.kv.str("k").u32(0xffffffffu).u32(0);
  expect_error(c, StatusCode::kDataLoss, "invalid value type");
  c.kv = Bytes();
  c.kv.str("k").u32(9).u32(77).u64(1);  // array of a bad type
  expect_error(c, StatusCode::kDataLoss, "array of invalid value type 77");
  c.kv = Bytes();
  c.kv.str("").u32(4).u32(0);
  expect_error(c, StatusCode::kDataLoss, "empty");
  c.kv = Bytes();
  c.kv.str("k").u32(8).u64((64ull << 20) + 1);  // string over the cap
  expect_error(c, StatusCode::kDataLoss, "more than the limit");

  // Duplicate key.
  c = valid_crafted();
  add_kv_str(&c, "general.architecture", "qwen2");
  expect_error(c, StatusCode::kDataLoss, "duplicate metadata key general.architecture");
}

TEST_F(GgufCrafted, HugeArrayCountsFailFast) {
  for (GgufType elem : {GgufType::kString, GgufType::kUint8, GgufType::kUint64, GgufType::kArray}) {
    Crafted c = valid_crafted();
    c.kv.str("tokenizer.ggml.tokens").u32(9).u32(static_cast<uint32_t>(elem)).u64(1ull << 60);
    ++c.n_kv;
    expect_error(c, StatusCode::kDataLoss, "truncated");
    c.kv.b.erase(c.kv.b.end() - 8, c.kv.b.end());
    c.kv.u64(~0ull);  // count * element size overflows
    expect_error(c, StatusCode::kDataLoss, "truncated");
  }
}

TEST_F(GgufCrafted, NestedArraysAreValidatedAndSkipped) {
  Crafted c = valid_crafted();
  // [[1, 2], ["x"]]: an array of 2 arrays.
  c.kv.str("nested").u32(9).u32(9).u64(2);
  c.kv.u32(4).u64(2).u32(1).u32(2);
  c.kv.u32(8).u64(1).str("x");
  ++c.n_kv;
  add_kv_u32(&c, "after", 5);
  std::string path = write_test_file(dir_, "nested.gguf", c.build());
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const GgufValue* v = (*r)->find("nested");
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->type, GgufType::kArray);
  EXPECT_EQ(v->elem_type, GgufType::kArray);
  EXPECT_EQ(v->count, 2u);
  EXPECT_EQ(*(*r)->get_int("after"), 5);

  // Nesting without end is refused.
  Crafted deep = valid_crafted();
  deep.kv.str("deep").u32(9);
  for (int i = 0; i < 10; ++i) deep.kv.u32(9).u64(1);
  deep.kv.u32(4).u64(0);
  ++deep.n_kv;
  expect_error(deep, StatusCode::kDataLoss, "too deeply");
}

TEST_F(GgufCrafted, AlignmentErrors) {
  for (uint32_t bad : {0u, 13u, 48u}) {
    Crafted c = valid_crafted();
    add_kv_u32(&c, "general.alignment", bad);
    expect_error(c, StatusCode::kDataLoss, "general.alignment " + std::to_string(bad) + " is not a power of two");
  }
  Crafted c = valid_crafted();
  c.kv.str("general.alignment").u32(static_cast<uint32_t>(GgufType::kUint64)).u64(32);
  ++c.n_kv;
  expect_error(c, StatusCode::kDataLoss, "expected uint32");
  c = valid_crafted();
  c.kv.str("general.alignment").u32(static_cast<uint32_t>(GgufType::kInt32)).i32(32);
  ++c.n_kv;
  expect_error(c, StatusCode::kDataLoss, "expected uint32");

  // A valid non-default alignment: offsets and the data section follow it.
  c = Crafted();
  add_kv_u32(&c, "general.alignment", 64);
  add_info(&c, "a", {4}, 0, 0);
  add_info(&c, "b", {4}, 0, 64);
  c.alignment = 64;
  c.data.zeros(64 + 16);
  std::string path = write_test_file(dir_, "align64.gguf", c.build());
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ((*r)->alignment(), 64u);
  EXPECT_EQ((*r)->data_offset() % 64, 0u);
  // ... and an offset that is a multiple of 32 but not of 64 is refused.
  c.infos = Bytes();
  c.n_tensors = 0;
  add_info(&c, "a", {4}, 0, 0);
  add_info(&c, "b", {4}, 0, 32);
  expect_error(c, StatusCode::kDataLoss, "not a multiple of the alignment 64");
}

TEST_F(GgufCrafted, SmallAlignmentCopiesMisalignedTensors) {
  Crafted c;
  add_kv_u32(&c, "general.alignment", 1);
  add_info(&c, "a", {1}, 1, 0);  // f16, 2 bytes
  add_info(&c, "b", {2}, 0, 2);  // f32 at data + 2
  c.alignment = 1;
  c.data.u8(0).u8(0x3c).f32(1.5f).f32(-2.5f);
  std::string path = write_test_file(dir_, "align1.gguf", c.build());
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const Tensor& b = (*r)->find_tensor("b")->tensor;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data) % 4, 0u);
  EXPECT_EQ(b.as<float>()[0], 1.5f);
  EXPECT_EQ(b.as<float>()[1], -2.5f);
}

TEST_F(GgufCrafted, TensorInfoErrors) {
  auto with_info = [](std::string_view name, std::vector<uint64_t> dims, uint32_t type, uint64_t offset) {
    Crafted c;
    add_kv_str(&c, "general.architecture", "llama");
    add_info(&c, name, dims, type, offset);
    c.data.zeros(4096);
    return c;
  };
  expect_error(with_info(std::string(70000, 'n'), {4}, 0, 0), StatusCode::kDataLoss,
               "tensor info 0 name has length 70000");
  expect_error(with_info("", {4}, 0, 0), StatusCode::kDataLoss, "empty name");
  expect_error(with_info("t", {1, 1, 1, 1, 1}, 0, 0), StatusCode::kDataLoss, "tensor t has 5 dims");
  expect_error(with_info("t", {}, 0, 0), StatusCode::kDataLoss, "tensor t has 0 dims");
  expect_error(with_info("t", {4, 0}, 0, 0), StatusCode::kDataLoss, "invalid dim 1 = 0");
  expect_error(with_info("t", {~0ull}, 0, 0), StatusCode::kDataLoss, "invalid dim 0");  // -1
  expect_error(with_info("t", {1ull << 62}, 0, 0), StatusCode::kDataLoss, "invalid dim 0");
  expect_error(with_info("t", {1ull << 31, 1ull << 31, 1ull << 2}, 0, 0), StatusCode::kDataLoss,
               "too many elements");
  expect_error(with_info("t", {1ull << 40, 1ull << 30}, 0, 0), StatusCode::kDataLoss, "too many elements");
  expect_error(with_info("t", {1ull << 61}, 0, 0), StatusCode::kDataLoss, "truncated: data of tensor t");
  expect_error(with_info("blk.0.attn_q.weight", {64, 64}, 16, 0), StatusCode::kUnimplemented,
               "tensor blk.0.attn_q.weight has unsupported type IQ2_XXS (16)");
  expect_error(with_info("blk.0.attn_q.weight", {64, 64}, 12, 0), StatusCode::kDataLoss,
               "tensor blk.0.attn_q.weight has row length 64, not a multiple of the q4_k block size 256");
  expect_error(with_info("t", {4}, 1000, 0), StatusCode::kUnimplemented, "unknown (1000)");
  expect_error(with_info("t", {31}, 8, 0), StatusCode::kDataLoss, "not a multiple of the q8_0 block size 32");
  expect_error(with_info("t", {4}, 0, 4), StatusCode::kDataLoss, "not a multiple of the alignment 32");
  expect_error(with_info("t", {4}, 0, 1ull << 20), StatusCode::kDataLoss, "truncated: data of tensor t");
  expect_error(with_info("t", {4}, 0, ~0ull - 31), StatusCode::kDataLoss, "truncated: data of tensor t");
  expect_error(with_info("t", {2048}, 0, 0), StatusCode::kDataLoss, "truncated: data of tensor t");

  Crafted dup = valid_crafted();
  add_info(&dup, "a", {4}, 0, 128);
  dup.data.zeros(128);
  expect_error(dup, StatusCode::kDataLoss, "duplicate tensor name a");
}

TEST_F(GgufCrafted, DataOneByteShort) {
  std::vector<uint8_t> bytes = valid_crafted().build();
  EXPECT_TRUE(open_bytes(bytes).ok());
  bytes.pop_back();
  Status s = open_bytes(bytes);
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("truncated: data of tensor b"), std::string::npos) << s.message();
}

TEST_F(GgufCrafted, TensorsWithoutPaddingBeforeDataFail) {
  Crafted c = valid_crafted();
  c.pad = false;  // data placed right after the infos, not at the aligned offset
  EXPECT_FALSE(open(c).ok());
}

TEST_F(GgufCrafted, BoolAndNumericTypes) {
  Crafted c = valid_crafted();
  c.kv.str("b").u32(7).u8(1);
  c.kv.str("i8").u32(1).u8(0xff);
  c.kv.str("u16").u32(2).put<uint16_t>(65535);
  c.kv.str("i64").u32(11).put<int64_t>(-7);
  c.kv.str("u64big").u32(10).u64(~0ull);
  c.kv.str("f64").u32(12).put<double>(2.5);
  c.kv.str("u64s").u32(9).u32(10).u64(2).u64(1).u64(~0ull);
  c.n_kv += 7;
  std::string path = write_test_file(dir_, "types.gguf", c.build());
  auto r = GgufFile::open(path);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const GgufFile& g = **r;
  EXPECT_TRUE(*g.get_bool("b"));
  EXPECT_EQ(*g.get_int("i8"), -1);
  EXPECT_EQ(*g.get_int("u16"), 65535);
  EXPECT_EQ(*g.get_int("i64"), -7);
  EXPECT_EQ(g.get_int("u64big").status().code(), StatusCode::kDataLoss);  // does not fit int64
  EXPECT_EQ(g.find("u64big")->u, ~0ull);
  EXPECT_EQ(*g.get_float("f64"), 2.5);
  EXPECT_FALSE(g.get_int_array("u64s").ok());
  EXPECT_EQ(g.get_float_array("u64s")->size(), 2u);
}

TEST(GgufTypes, Names) {
  EXPECT_EQ(ggml_type_name(12), "Q4_K");
  EXPECT_EQ(ggml_type_name(30), "BF16");
  EXPECT_EQ(ggml_type_name(5000), "unknown");
  EXPECT_EQ(ggml_type_name(14), "Q6_K");
  EXPECT_EQ(ggml_type_name(24), "I8");
  for (const DTypeTraits& t : all_dtypes()) {
    EXPECT_EQ(dtype_from_ggml_type(ggml_type_of(t.type)), t.type);
    // The ggml name is the DType's, upper-cased: the id column of the table is right.
    std::string upper(t.name);
    for (char& c : upper) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    EXPECT_EQ(ggml_type_name(ggml_type_of(t.type)), upper);
  }
  EXPECT_EQ(dtype_from_ggml_type(16), std::nullopt);  // IQ2_XXS: not a type we run
}

}  // namespace
}  // namespace pagoda
