#include "base/sha256.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

namespace pagoda {
namespace {

std::span<const uint8_t> bytes_of(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// FIPS 180-2, appendix B.
TEST(Sha256, FipsVectors) {
  EXPECT_EQ(to_hex(sha256(bytes_of("abc"))),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(to_hex(sha256(bytes_of(""))),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(to_hex(sha256(bytes_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(to_hex(sha256(bytes_of(std::string(1000000, 'a')))),
            "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST(Sha256, IncrementalMatchesOneShotOnRandomSplits) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<uint8_t> data(std::uniform_int_distribution<size_t>(0, 3000)(rng));
    for (auto& b : data) b = static_cast<uint8_t>(rng());
    Sha256 h;
    size_t pos = 0;
    while (pos < data.size()) {
      const size_t n = std::uniform_int_distribution<size_t>(0, data.size() - pos)(rng);
      h.update(std::span<const uint8_t>(data).subspan(pos, n));
      pos += n;
    }
    EXPECT_EQ(h.finish(), sha256(data)) << "size " << data.size();
  }
}

TEST(Sha256, FinishStartsANewMessageAndMovesKeepState) {
  Sha256 h;
  h.update(std::string_view("ab"));
  Sha256 moved = std::move(h);
  moved.update(std::string_view("c"));
  EXPECT_EQ(moved.finish(), sha256(bytes_of("abc")));
  EXPECT_EQ(moved.finish(), sha256(bytes_of("")));
  Sha256 other;
  other = std::move(moved);
  other.update(std::string_view("abc"));
  EXPECT_EQ(to_hex(other.finish()), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

}  // namespace
}  // namespace pagoda
