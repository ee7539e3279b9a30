// GBNF grammars read into Grammar and matched byte by byte: what each notation accepts and
// refuses, checked against strings written out by hand and, for character classes, against the
// code point ranges themselves (every boundary and random code points, encoded by the test).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "structured/gbnf.h"
#include "structured/grammar_matcher.h"
#include "structured/structured_test_util.h"

namespace pagoda::structured {
namespace {

std::shared_ptr<const CompiledGrammar> compile(const std::string& gbnf) {
  Result<Grammar> g = parse_gbnf(gbnf);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return nullptr;
  return std::make_shared<const CompiledGrammar>(std::move(*g));
}

// Whether `text` is a whole match of the grammar.
bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.can_end();
}

// Whether `text` is the start of some match.
bool is_prefix(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept(text);
}

std::string error_of(const std::string& gbnf) {
  Result<Grammar> g = parse_gbnf(gbnf);
  return g.ok() ? std::string("(accepted)") : g.status().message();
}

using testing::utf8;

TEST(Gbnf, LiteralsAlternativesAndGroups) {
  auto g = compile(R"(root ::= "yes" | "no" | ("may" "be")? "x")");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"yes", "no", "maybex", "x"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"", "ye", "yess", "maybe", "mayx", "nox"}) EXPECT_FALSE(matches(g, bad)) << bad;
  EXPECT_TRUE(is_prefix(g, "ye"));
  EXPECT_TRUE(is_prefix(g, "mayb"));
  EXPECT_FALSE(is_prefix(g, "yo"));
  // A match that has ended takes no more bytes, and a refused byte leaves the state as it was.
  GrammarMatcher m(g);
  EXPECT_TRUE(m.accept("no"));
  EXPECT_TRUE(m.can_end());
  EXPECT_FALSE(m.can_continue());
  EXPECT_FALSE(m.accept("x"));
  EXPECT_TRUE(m.can_end());
}

TEST(Gbnf, RepetitionBounds) {
  auto g = compile("root ::= [ab]{2,3} \"-\" [0-9]+ \"-\" \"x\"* \"-\" \"y\"{2} \"-\" \"z\"{,2} \"-\" \"w\"{1,}");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(matches(g, "ab-1--yy--w"));
  EXPECT_TRUE(matches(g, "bab-0123-xxx-yy-zz-www"));
  EXPECT_FALSE(matches(g, "a-1--yy--w"));        // {2,3}: too few
  EXPECT_FALSE(matches(g, "abab-1--yy--w"));     // {2,3}: too many
  EXPECT_FALSE(matches(g, "ab---yy--w"));        // +: at least one digit
  EXPECT_FALSE(matches(g, "ab-1--y--w"));        // {2}: exactly two
  EXPECT_FALSE(matches(g, "ab-1--yy-zzz-w"));    // {,2}
  EXPECT_FALSE(matches(g, "ab-1--yy--"));        // {1,}
}

TEST(Gbnf, RulesReferencesRecursionAndLayout) {
  // A rule may be used before it is defined, continue on lines that start with '|', span lines
  // inside parentheses, and recurse on the right (nested lists).
  auto g = compile(R"(# lists of digits
root ::= list
list ::= "[" ws ( item ( "," ws item )* )? "]"
item ::= [0-9]
  | list   # nested
ws   ::= [ \t\n]*
)");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"[]", "[1]", "[1, 2,3]", "[[1],[[]], 2]", "[ \n1]"}) EXPECT_TRUE(matches(g, ok)) << ok;
  for (const char* bad : {"[", "[1,]", "[12]", "[1 ]", "[[1]"}) EXPECT_FALSE(matches(g, bad)) << bad;
}

TEST(Gbnf, EscapesAndUtf8) {
  auto g = compile(R"(root ::= "\x41\u00e9\U0001F600\t\"\\" [\]\-] "ü")");
  ASSERT_NE(g, nullptr);
  EXPECT_TRUE(matches(g, "A\xC3\xA9\xF0\x9F\x98\x80\t\"\\]\xC3\xBC"));
  EXPECT_TRUE(matches(g, "A\xC3\xA9\xF0\x9F\x98\x80\t\"\\-\xC3\xBC"));
  // A character is its UTF-8 bytes: a prefix of them is a prefix of the match, not a match.
  auto any = compile("root ::= .");
  ASSERT_NE(any, nullptr);
  EXPECT_TRUE(is_prefix(any, "\xF0\x9F"));
  EXPECT_FALSE(matches(any, "\xF0\x9F"));
  EXPECT_TRUE(matches(any, "\xF0\x9F\x98\x80"));
  EXPECT_FALSE(is_prefix(any, "\xED\xA0\x80"));  // a surrogate is not a character
  EXPECT_FALSE(is_prefix(any, "\xC0\x80"));      // an overlong encoding is not either
  EXPECT_FALSE(is_prefix(any, "\x80"));          // nor a lone continuation byte
}

// Classes against their code point ranges: every range's ends and their neighbours, the UTF-8
// length boundaries, and random code points.
TEST(Gbnf, ClassesMatchExactlyTheirCodePoints) {
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {
      {0x30, 0x39}, {0x7F, 0x81}, {0x7FE, 0x801}, {0xD7F0, 0xE010}, {0xFFF0, 0x10010}, {0x10FFF0, 0x10FFFF}};
  std::string cls;
  char buf[32];
  for (auto [lo, hi] : ranges) {
    std::snprintf(buf, sizeof buf, "\\U%08X-\\U%08X", lo, hi);
    cls += buf;
  }
  auto in = compile("root ::= [" + cls + "]");
  auto out = compile("root ::= [^" + cls + "]");
  ASSERT_NE(in, nullptr);
  ASSERT_NE(out, nullptr);
  const auto member = [&](uint32_t c) {
    for (auto [lo, hi] : ranges) {
      if (c >= lo && c <= hi) return true;
    }
    return false;
  };
  std::vector<uint32_t> probes = {0, 0x7F, 0x80, 0x7FF, 0x800, 0xFFFF, 0x10000, 0x10FFFF};
  for (auto [lo, hi] : ranges) {
    for (uint32_t c : {lo - 1, lo, lo + 1, hi - 1, hi, hi + 1}) probes.push_back(c);
  }
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> any(0, 0x10FFFF);
  for (int i = 0; i < 3000; ++i) probes.push_back(any(rng));
  for (uint32_t c : probes) {
    if (c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) continue;
    EXPECT_EQ(matches(in, utf8(c)), member(c)) << std::hex << c;
    EXPECT_EQ(matches(out, utf8(c)), !member(c)) << std::hex << c;
  }
}

TEST(Gbnf, ErrorsNameTheProblemAndWhere) {
  EXPECT_EQ(error_of("root ::= item"), "GBNF: rule 'item' is used but never defined");
  EXPECT_EQ(error_of("item ::= \"a\""), "GBNF: the grammar has no rule 'root'");
  EXPECT_EQ(error_of("root ::= \"a\"\nroot ::= \"b\""), "GBNF: line 2, column 1: rule 'root' is defined twice");
  EXPECT_EQ(error_of("root ::= \"\\q\""), "GBNF: line 1, column 13: unknown escape '\\q'");
  EXPECT_EQ(error_of("root ::= (\"a\""), "GBNF: line 1, column 14: expected ')'");
  EXPECT_EQ(error_of("root \"a\""), "GBNF: line 1, column 6: expected '::=' after 'root'");
  EXPECT_EQ(error_of("root ::= [z-a]"), "GBNF: line 1, column 14: a class range ends before it starts");
  EXPECT_EQ(error_of("root ::= \"a\"{3,2}"), "GBNF: line 1, column 17: {3,2} has max < min");
  EXPECT_EQ(error_of("root ::= \"abc"), "GBNF: line 1, column 14: unterminated literal");
  // Left recursion, directly and through a rule that can be empty, is refused with its cycle.
  EXPECT_EQ(error_of("root ::= root \"a\" | \"a\""),
            "GBNF: rule 'root' is left-recursive (root -> root); write the repetition on the right");
  EXPECT_EQ(error_of("root ::= e x\nx ::= root \"a\" | \"b\"\ne ::= \"\" | \"c\""),
            "GBNF: rule 'root' is left-recursive (root -> x -> root); write the repetition on the right");
}

TEST(Gbnf, HostileGrammarsAreRefusedOrBounded) {
  EXPECT_NE(error_of("root ::= \"a\"{100000}").find("over"), std::string::npos);
  EXPECT_NE(error_of("root ::= \"a\"{1,99999999999999999999}").find("over"), std::string::npos);
  EXPECT_NE(error_of("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')')).find("nested deeper than 200"),
            std::string::npos);
  EXPECT_NE(error_of("root ::= \"\xC3\"").find("not UTF-8"), std::string::npos);
  // Deep but legal nesting, and an ambiguous grammar (every split of the a's) stay fast: the
  // matcher shares equal stacks.
  auto deep = compile("root ::= " + std::string(150, '(') + "\"a\"" + std::string(150, ')'));
  ASSERT_NE(deep, nullptr);
  EXPECT_TRUE(matches(deep, "a"));
  auto ambiguous = compile("root ::= x*\nx ::= \"a\" | \"aa\" | \"aaa\"");
  ASSERT_NE(ambiguous, nullptr);
  EXPECT_TRUE(matches(ambiguous, std::string(5000, 'a')));
  EXPECT_FALSE(matches(ambiguous, std::string(5000, 'a') + "b"));
}

}  // namespace
}  // namespace pagoda::structured
