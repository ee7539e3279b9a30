#include "tokenizer/unicode.h"

#include <gtest/gtest.h>

#include <set>

namespace pagoda::unicode {
namespace {

TEST(Unicode, DecodesAndEncodes) {
  for (char32_t cp : {0x41u, 0x7Fu, 0x80u, 0x7FFu, 0x800u, 0xFFFDu, 0x10000u, 0x1F999u, 0x10FFFFu}) {
    std::string s;
    append_utf8(cp, s);
    Utf8Step step = decode_utf8(s, 0);
    EXPECT_TRUE(step.valid) << static_cast<uint32_t>(cp);
    EXPECT_EQ(static_cast<uint32_t>(step.code_point), static_cast<uint32_t>(cp));
    EXPECT_EQ(step.length, s.size());
  }
  std::string surrogate;
  append_utf8(0xD800, surrogate);
  EXPECT_EQ(surrogate, "\xEF\xBF\xBD");
}

TEST(Unicode, SanitizeReplacesMaximalSubparts) {
  EXPECT_EQ(sanitize_utf8("abc"), "abc");
  EXPECT_EQ(sanitize_utf8("h\xC3\xA9!"), "h\xC3\xA9!");
  // One U+FFFD per maximal subpart, as Python's errors="replace" and Rust's from_utf8_lossy.
  EXPECT_EQ(sanitize_utf8("\xE2\x82" "A"), "\xEF\xBF\xBD" "A");
  EXPECT_EQ(sanitize_utf8("\x80\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(sanitize_utf8("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
  EXPECT_EQ(sanitize_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");  // overlong
  EXPECT_EQ(sanitize_utf8("\xF0\x9F\xA6"), "\xEF\xBF\xBD");           // truncated at the end
  EXPECT_EQ(sanitize_utf8("\xF5"), "\xEF\xBF\xBD");
  EXPECT_FALSE(is_valid_utf8("\xF0\x9F\xA6"));
  EXPECT_TRUE(is_valid_utf8("\xF0\x9F\xA6\x99"));
}

TEST(Unicode, CompletePrefixHoldsOnlyUnfinishedCharacters) {
  EXPECT_EQ(complete_utf8_prefix(""), 0u);
  EXPECT_EQ(complete_utf8_prefix("ab"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xF0"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xF0\x9F"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xF0\x9F\xA6"), 2u);
  EXPECT_EQ(complete_utf8_prefix("ab\xF0\x9F\xA6\x99"), 6u);
  EXPECT_EQ(complete_utf8_prefix("ab\xF0" "A"), 4u);   // already invalid: nothing to wait for
  EXPECT_EQ(complete_utf8_prefix("ab\xE0\x80"), 4u);   // E0 80 can never be completed
  EXPECT_EQ(complete_utf8_prefix("\x80"), 1u);
}

TEST(Unicode, CompletePrefixAgreesWithSanitizeOnAllSplits) {
  const std::string samples[] = {"a\xF0\x9F\xA6\x99z", "\xE2\x82\xAC\xE2\x82", "\xC3\xA9\xED\xA0\x80x",
                                 "\xF0\x9F\x98\xB6\xE2\x80\x8D\xF0\x9F\x8C\xAB\xEF\xB8\x8F"};
  for (const std::string& s : samples) {
    // Feed the bytes one at a time, emitting complete prefixes, as a detokenizer does.
    std::string pending, out;
    for (char c : s) {
      pending.push_back(c);
      size_t n = complete_utf8_prefix(pending);
      out += sanitize_utf8(std::string_view(pending).substr(0, n));
      pending.erase(0, n);
    }
    out += sanitize_utf8(pending);
    EXPECT_EQ(out, sanitize_utf8(s));
  }
}

TEST(Unicode, Gpt2ByteTableIsABijection) {
  const auto& table = byte_to_code_point();
  std::set<char32_t> seen(table.begin(), table.end());
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(static_cast<uint32_t>(table[' ']), 0x120u);   // "Ġ"
  EXPECT_EQ(static_cast<uint32_t>(table['\n']), 0x10Au);  // "Ċ"
  EXPECT_EQ(static_cast<uint32_t>(table['A']), static_cast<uint32_t>('A'));
  for (int b = 0; b < 256; ++b) EXPECT_EQ(code_point_to_byte(table[b]), b);
  EXPECT_EQ(code_point_to_byte(0x20), -1);
  EXPECT_EQ(code_point_to_byte(0x144), -1);
}

}  // namespace
}  // namespace pagoda::unicode
