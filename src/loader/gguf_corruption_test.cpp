// Truncated and corrupted copies of the real GGUF files: open() must fail cleanly or produce a
// file whose invariants hold; it must never crash or allocate according to a corrupted count.
// (Under AddressSanitizer a huge allocation aborts the test.)
#include <fcntl.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <random>
#include <set>

#include "loader/gguf_file.h"
#include "loader/model_source.h"
#include "support/test_data.h"

namespace pagoda {
namespace {

struct RealFile {
  const char* relative;
  uint64_t dense_prefix;  // every truncation point / byte mutation below this offset
  int spread_points;      // plus this many spread over the rest of the file
  int random_mutations;
  bool is_model;          // also run load_model
};

constexpr RealFile kRealFiles[] = {
    {"stories260K/stories260K.gguf", 2048, 300, 600, true},
    // Each successful parse of these walks 32000 / 100257 strings: fewer points.
    {"vocab/ggml-vocab-llama-spm.gguf", 256, 120, 100, false},
    {"vocab/ggml-vocab-gpt-2.gguf", 128, 80, 60, false},
};

// Checks what a successful open promises: every tensor lies inside the file's data.
void expect_invariants(const GgufFile& g, const std::string& context) {
  auto map = g.mapping();
  EXPECT_TRUE(g.alignment() != 0 && (g.alignment() & (g.alignment() - 1)) == 0) << context;
  for (const GgufTensorInfo& t : g.tensors()) {
    ASSERT_GE(t.tensor.ndim, 1) << context;
    ASSERT_LE(t.tensor.ndim, kMaxDims) << context;
    for (int d = 0; d < t.tensor.ndim; ++d) ASSERT_GT(t.tensor.shape[d], 0) << context;
    uint64_t begin = g.data_offset() + t.offset;
    uint64_t nbytes = static_cast<uint64_t>(t.tensor.nbytes());
    ASSERT_LE(begin, map->size()) << context << " " << t.name;
    ASSERT_LE(nbytes, map->size() - begin) << context << " " << t.name;
    if (g.alignment() >= 4) {
      EXPECT_EQ(static_cast<const uint8_t*>(t.tensor.data), map->data() + begin) << context;
    }
  }
}

// Copies `src` into a fresh temp dir and returns the copy's path.
std::string copy_to_temp(const std::string& src) {
  std::string dst = testing::make_temp_dir() + "/" + std::filesystem::path(src).filename().string();
  std::filesystem::copy_file(src, dst);
  std::filesystem::permissions(dst, std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  return dst;
}

class GgufCorruption : public ::testing::TestWithParam<RealFile> {};

TEST_P(GgufCorruption, EveryTruncationFails) {
  const RealFile& rf = GetParam();
  PAGODA_TEST_FILE(src, rf.relative);
  std::string path = copy_to_temp(src);
  const uint64_t size = std::filesystem::file_size(path);
  std::set<uint64_t, std::greater<>> points;  // descending: each cut shortens the same file
  for (uint64_t p = 0; p < std::min(rf.dense_prefix, size); ++p) points.insert(p);
  for (int k = 0; k <= rf.spread_points; ++k) points.insert(size * k / (rf.spread_points + 1));
  points.insert(size - 1);
  points.erase(size);

  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  for (uint64_t p : points) {
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(p)), 0);
    auto r = GgufFile::open(path);
    ASSERT_FALSE(r.ok()) << "truncated at " << p << " still opens";
    EXPECT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << r.status().message();
    if (rf.is_model && p % 7 == 0) {
      EXPECT_FALSE(load_model(path, LoadOptions{}).ok()) << "truncated at " << p;
    }
  }
  ::close(fd);
}

TEST_P(GgufCorruption, ByteMutationsFailOrKeepInvariants) {
  const RealFile& rf = GetParam();
  PAGODA_TEST_FILE(src, rf.relative);
  std::string path = copy_to_temp(src);
  const uint64_t size = std::filesystem::file_size(path);
  uint64_t header_end = size;
  {
    auto g = GgufFile::open(path);
    ASSERT_TRUE(g.ok()) << g.status().message();
    if (!(*g)->tensors().empty()) header_end = (*g)->data_offset();
  }

  int fd = ::open(path.c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  int opened = 0;
  auto mutate = [&](uint64_t pos, std::vector<uint8_t> values) {
    std::vector<uint8_t> original(values.size());
    ASSERT_EQ(::pread(fd, original.data(), original.size(), static_cast<off_t>(pos)),
              static_cast<ssize_t>(original.size()));
    ASSERT_EQ(::pwrite(fd, values.data(), values.size(), static_cast<off_t>(pos)),
              static_cast<ssize_t>(values.size()));
    std::string context = "bytes at " + std::to_string(pos);
    auto r = GgufFile::open(path);
    if (r.ok()) {
      ++opened;
      expect_invariants(**r, context);
      if (rf.is_model) {
        auto m = load_model(path, LoadOptions{});
        if (m.ok()) {
          EXPECT_TRUE(check_weights(m->config, m->weights).ok());
        }
      }
    } else {
      EXPECT_EQ(r.status().message().rfind(path + ": ", 0), 0u) << r.status().message();
    }
    ASSERT_EQ(::pwrite(fd, original.data(), original.size(), static_cast<off_t>(pos)),
              static_cast<ssize_t>(original.size()));
  };
  for (uint64_t p = 0; p < std::min(rf.dense_prefix, header_end); ++p) {
    mutate(p, {0xff});
    mutate(p, {0x00});
  }
  std::mt19937_64 rng(1234);
  for (int k = 0; k < rf.random_mutations; ++k) {
    uint64_t pos = rng() % header_end;
    size_t len = 1 + rng() % 8;
    if (pos + len > size) len = size - pos;
    std::vector<uint8_t> values(len);
    for (auto& v : values) v = static_cast<uint8_t>(rng());
    if (k % 3 == 0) std::fill(values.begin(), values.end(), 0xff);  // huge counts and lengths
    mutate(pos, values);
  }
  ::close(fd);
  // Mutations of e.g. string contents are harmless: some must still open.
  EXPECT_GT(opened, 0);
}

INSTANTIATE_TEST_SUITE_P(RealFiles, GgufCorruption, ::testing::ValuesIn(kRealFiles),
                         [](const ::testing::TestParamInfo<RealFile>& info) {
                           std::string name = std::filesystem::path(info.param.relative).stem().string();
                           std::replace_if(name.begin(), name.end(), [](char c) { return !std::isalnum(static_cast<unsigned char>(c)); }, '_');
                           return name;
                         });

}  // namespace
}  // namespace pagoda
