#include "base/status.h"

#include <gtest/gtest.h>

#include "base/checked_math.h"
#include "base/mapped_file.h"

namespace pagoda {
namespace {

Result<int> parse_positive(int v) {
  if (v <= 0) return invalid_argument("not positive: " + std::to_string(v));
  return v;
}

Result<int> doubled(int v) {
  PAGODA_ASSIGN_OR_RETURN(int x, parse_positive(v));
  return 2 * x;
}

TEST(Status, ResultCarriesValueOrError) {
  EXPECT_EQ(*doubled(4), 8);
  Result<int> bad = doubled(-1);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(bad.status().message(), "not positive: -1");
  EXPECT_EQ(bad.status().with_context("f.gguf").message(), "f.gguf: not positive: -1");
}

TEST(CheckedMath, DetectsOverflow) {
  uint64_t out;
  EXPECT_TRUE(checked_mul(1ull << 31, 1ull << 31, &out));
  EXPECT_FALSE(checked_mul(1ull << 32, 1ull << 32, &out));
  EXPECT_FALSE(checked_add(~0ull, 1, &out));
  ASSERT_TRUE(checked_align_up(33, 32, &out));
  EXPECT_EQ(out, 64u);
  EXPECT_FALSE(checked_align_up(~0ull - 3, 32, &out));
}

TEST(MappedFile, MissingFileNamesPath) {
  auto r = MappedFile::open("/nonexistent/pagoda.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/pagoda.gguf"), std::string::npos);
}

}  // namespace
}  // namespace pagoda
