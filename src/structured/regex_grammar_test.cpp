// Regular expressions read into Grammar and matched byte by byte: what each construct accepts
// and refuses, checked against strings written out by hand, against code point predicates
// written here for the classes, and against std::regex (ECMAScript) on random patterns.
#include "structured/regex_grammar.h"

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "structured/grammar_matcher.h"
#include "structured/structured_test_util.h"

namespace pagoda::structured {
namespace {

// A compiled pattern with one StateSpace, so that many texts cost little to check.
class Pattern {
 public:
  // Whole-text semantics through regex_grammar(), or add_regex() with `options`.
  explicit Pattern(const std::string& pattern, std::optional<RegexOptions> options = std::nullopt) {
    Result<Grammar> g = options ? via_builder(pattern, *options) : regex_grammar(pattern);
    EXPECT_TRUE(g.ok()) << pattern << ": " << g.status().message();
    if (!g.ok()) return;
    grammar_ = std::make_shared<const CompiledGrammar>(std::move(*g));
    space_ = std::make_unique<StateSpace>(grammar_);
  }

  bool ok() const { return space_ != nullptr; }
  const Grammar& grammar() const { return grammar_->grammar(); }

  // Whether `text` is a whole match.
  bool matches(std::string_view text) {
    if (!space_) return false;
    const int32_t s = space_->next(space_->root(), text);
    return s != StateSpace::kDead && space_->ended(s);
  }
  // Whether `text` is the start of some match.
  bool is_prefix(std::string_view text) {
    return space_ && space_->next(space_->root(), text) != StateSpace::kDead;
  }

 private:
  static Result<Grammar> via_builder(const std::string& pattern, const RegexOptions& options) {
    GrammarBuilder b;
    Result<Element> e = add_regex(b, pattern, options, "pattern");
    if (!e.ok()) return e.status();
    return std::move(b).build(e->index);
  }

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::unique_ptr<StateSpace> space_;
};

RegexOptions json_string() {
  RegexOptions o;
  o.json_string = true;
  return o;
}
RegexOptions search(bool json = false) {
  RegexOptions o;
  o.search = true;
  o.json_string = json;
  return o;
}

std::string error_of(const std::string& pattern, const RegexOptions& options = {}) {
  GrammarBuilder b;
  Result<Element> e = add_regex(b, pattern, options, "pattern");
  return e.ok() ? std::string("(accepted)") : e.status().message();
}

using testing::utf8;

// How RFC 8259 writers (JSON.stringify, Python's json) spell a character inside a string.
std::string json_spelling(uint32_t c) {
  static const char* const kShort[] = {"\\b", "\\t", "\\n", nullptr, "\\f", "\\r"};
  if (c == '"') return "\\\"";
  if (c == '\\') return "\\\\";
  if (c >= 8 && c <= 13 && kShort[c - 8] != nullptr) return kShort[c - 8];
  if (c < 0x20) return std::string("\\u00") + "0123456789abcdef"[c >> 4] + "0123456789abcdef"[c & 15];
  return utf8(c);
}

// Code points to try a class on: all of ASCII and Latin-1, the UTF-8 length edges, the
// neighbours of the surrogates and of `extra`, and random ones.
std::vector<uint32_t> probes(std::vector<uint32_t> extra = {}) {
  std::vector<uint32_t> out;
  for (uint32_t c = 0; c < 0x180; ++c) out.push_back(c);
  for (uint32_t c : {0x7FFu, 0x800u, 0xD7FFu, 0xE000u, 0xFFFFu, 0x10000u, 0x10FFFFu}) out.push_back(c);
  for (uint32_t c : extra) {
    for (uint32_t d = c - 1; d <= c + 1; ++d) out.push_back(d);
  }
  std::mt19937 rng(11);
  std::uniform_int_distribution<uint32_t> any(0, 0x10FFFF);
  for (int i = 0; i < 1500; ++i) out.push_back(any(rng));
  std::erase_if(out, [](uint32_t c) { return c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF); });
  return out;
}

// ECMAScript's WhiteSpace and LineTerminator code points, listed from the standard.
bool is_ecma_space(uint32_t c) {
  for (uint32_t s : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u, 0x202Fu, 0x205Fu,
                     0x3000u, 0xFEFFu}) {
    if (c == s) return true;
  }
  return c >= 0x2000 && c <= 0x200A;
}
bool is_word(uint32_t c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

// That the one-character pattern `pattern` matches exactly the code points `member` holds.
void expect_class(const std::string& pattern, const std::function<bool(uint32_t)>& member,
                  std::vector<uint32_t> extra = {}) {
  Pattern p(pattern);
  ASSERT_TRUE(p.ok()) << pattern;
  for (uint32_t c : probes(std::move(extra))) EXPECT_EQ(p.matches(utf8(c)), member(c)) << pattern << " U+" << std::hex << c;
  EXPECT_FALSE(p.matches("")) << pattern;
}

TEST(RegexGrammar, LiteralsAlternationAndGroups) {
  struct Case {
    const char* pattern;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"abc", {"abc"}, {"", "ab", "abcd", "abd", "ABC"}},
      // '|' binds loosest: "ab|cd" is (ab)|(cd), not a(b|c)d.
      {"ab|cd", {"ab", "cd"}, {"abd", "acd", "abcd", "b", ""}},
      {"a(b|c)d", {"abd", "acd"}, {"ad", "ab", "abcd", "cd"}},
      {"ab|cd|", {"ab", "cd", ""}, {"a", "abcd"}},
      {"x(a|b(c|d)e|)y", {"xay", "xbcey", "xbdey", "xy"}, {"xby", "xbey", "xaey", "xcy"}},
      {"(?:ab)(cd)(?<n>ef)(?P<m>g)", {"abcdefg"}, {"abcdef", "abcdefgg"}},
      {"((((a))))|(((b)))c", {"a", "bc"}, {"ac", "b", "abc"}},
      {"()a()", {"a"}, {"", "aa"}},
      {"", {""}, {"a"}},
      {"^ab$", {"ab"}, {"", "^ab$", "abab"}},  // whole-text: the anchors change nothing
      {"^a|b$", {"a", "b"}, {"ab", "a|b"}},
      {"]}", {"]}"}, {"]", "}"}},  // lone closers are characters in both dialects
  };
  for (const Case& c : cases) {
    Pattern p(c.pattern);
    ASSERT_TRUE(p.ok()) << c.pattern;
    for (const std::string& s : c.yes) EXPECT_TRUE(p.matches(s)) << c.pattern << " vs '" << s << "'";
    for (const std::string& s : c.no) EXPECT_FALSE(p.matches(s)) << c.pattern << " vs '" << s << "'";
  }
}

TEST(RegexGrammar, QuantifierBounds) {
  struct Case {
    const char* pattern;
    int min, max;  // how many 'a's it takes; max < 0: no limit
  };
  const std::vector<Case> cases = {
      {"a*", 0, -1},     {"a+", 1, -1},      {"a?", 0, 1},       {"a{3}", 3, 3},     {"a{2,}", 2, -1},
      {"a{2,4}", 2, 4},  {"a{0}", 0, 0},     {"a{0,1}", 0, 1},   {"a{1}", 1, 1},     {"a{0,}", 0, -1},
      {"a*?", 0, -1},    {"a+?", 1, -1},     {"a??", 0, 1},      {"a{3}?", 3, 3},    {"a{2,}?", 2, -1},
      {"a{2,4}?", 2, 4}, {"(?:a){2,3}", 2, 3}, {"(a){1,2}", 1, 2}, {"[a]{5,6}", 5, 6}, {"(?:aa)+", -2, -1},
  };
  for (const Case& c : cases) {
    Pattern p(c.pattern);
    ASSERT_TRUE(p.ok()) << c.pattern;
    for (int n = 0; n <= 8; ++n) {
      // (?:aa)+: an even number of at least two.
      const bool want = c.min == -2 ? n >= 2 && n % 2 == 0 : n >= c.min && (c.max < 0 || n <= c.max);
      EXPECT_EQ(p.matches(std::string(static_cast<size_t>(n), 'a')), want) << c.pattern << " x" << n;
    }
  }
  // A quantifier takes the atom before it only: one character, class, escape or group.
  Pattern multi("ab{2}(cd){2}[xy]{2}\\.{2}é{2}");
  EXPECT_TRUE(multi.matches("abbcdcdxy..éé"));
  EXPECT_FALSE(multi.matches("ababcdcdxy..éé"));
  EXPECT_FALSE(multi.matches("abbcdcdxy..é\xA9"));
  Pattern bounds("x{9999}y{0,10000}");
  EXPECT_TRUE(bounds.matches(std::string(9999, 'x')));
  EXPECT_TRUE(bounds.matches(std::string(9999, 'x') + std::string(10000, 'y')));
  EXPECT_FALSE(bounds.matches(std::string(9998, 'x')));
  EXPECT_FALSE(bounds.matches(std::string(9999, 'x') + std::string(10001, 'y')));
}

// A repetition of something that can match nothing: the same language as repeating its
// non-empty part (and no left-recursive rule, which build() would refuse).
TEST(RegexGrammar, RepeatingWhatCanBeEmpty) {
  struct Case {
    const char* pattern;
    std::function<bool(const std::string&)> want;
  };
  auto only = [](const std::string& set) {
    return [set](const std::string& s) { return s.find_first_not_of(set) == std::string::npos; };
  };
  const std::vector<Case> cases = {
      {"(a?)*", only("a")},
      {"(a*)+", only("a")},
      {"(a|)*", only("a")},
      {"(a?b?)*", only("ab")},
      {"(a*b*){2,}", only("ab")},
      {"(?:a?|b*)+?", only("ab")},
      {"((a?)*){3}", only("a")},
      {"()*", [](const std::string& s) { return s.empty(); }},
      {"(a{0})+", [](const std::string& s) { return s.empty(); }},
      {"(a?){0,2}", [](const std::string& s) { return s.size() <= 2 && s.find_first_not_of('a') == std::string::npos; }},
      // Bounded, the non-empty part keeps what follows its first non-empty item.
      {"(a?b?){2}", [](const std::string& s) {
         const std::vector<std::string> part = {"", "a", "b", "ab"};
         for (const std::string& u : part) {
           for (const std::string& v : part) {
             if (u + v == s) return true;
           }
         }
         return false;
       }},
      {"(a?b){2}", [](const std::string& s) { return s == "bb" || s == "abb" || s == "bab" || s == "abab"; }},
      {"(a?b?)*c", [](const std::string& s) { return !s.empty() && s.back() == 'c' && s.find_first_not_of("ab") == s.size() - 1; }},
  };
  std::vector<std::string> texts = {""};
  for (size_t i = 0; i < texts.size() && texts[i].size() < 5; ++i) {
    for (char ch : std::string("abc")) texts.push_back(texts[i] + ch);
  }
  for (const Case& c : cases) {
    Pattern p(c.pattern);
    ASSERT_TRUE(p.ok()) << c.pattern;
    for (const std::string& s : texts) EXPECT_EQ(p.matches(s), c.want(s)) << c.pattern << " vs '" << s << "'";
  }
}

TEST(RegexGrammar, ClassEscapesMatchTheirCodePoints) {
  auto digit = [](uint32_t c) { return c >= '0' && c <= '9'; };
  expect_class("\\d", digit);
  expect_class("\\D", [&](uint32_t c) { return !digit(c); });
  expect_class("\\w", is_word);
  expect_class("\\W", [](uint32_t c) { return !is_word(c); });
  expect_class("\\s", is_ecma_space, {0x1680, 0x2000, 0x200A, 0x2028, 0x202F, 0x205F, 0x3000, 0xFEFF});
  expect_class("\\S", [](uint32_t c) { return !is_ecma_space(c); }, {0x2000, 0x200A, 0xFEFF});
  expect_class(".", [](uint32_t c) { return c != '\n'; });
  expect_class("[\\s\\S]", [](uint32_t) { return true; });
  expect_class("[^\\W]", is_word);
  expect_class("[^\\d\\s]", [&](uint32_t c) { return !digit(c) && !is_ecma_space(c); }, {0x3000});
  expect_class("[\\w-]", [](uint32_t c) { return is_word(c) || c == '-'; });
}

TEST(RegexGrammar, ClassesMatchTheirCodePoints) {
  expect_class("[a-cx]", [](uint32_t c) { return (c >= 'a' && c <= 'c') || c == 'x'; });
  expect_class("[^a-cx]", [](uint32_t c) { return !((c >= 'a' && c <= 'c') || c == 'x'); });
  // '-' first or last is itself; ']' '\' '-' '^' escaped; '[' and '^' (not first) are themselves.
  expect_class("[-a]", [](uint32_t c) { return c == '-' || c == 'a'; });
  expect_class("[a-]", [](uint32_t c) { return c == '-' || c == 'a'; });
  expect_class("[\\]\\\\\\-\\^]", [](uint32_t c) { return c == ']' || c == '\\' || c == '-' || c == '^'; });
  expect_class("[[a^]", [](uint32_t c) { return c == '[' || c == 'a' || c == '^'; });
  expect_class("[.*+?(){}|$]", [](uint32_t c) { return std::string_view(".*+?(){}|$").find(static_cast<char>(c)) != std::string_view::npos && c < 0x80; });
  // Escapes inside: \b is the backspace there.
  expect_class("[\\t\\n\\r\\f\\v\\0\\b\\x41\\u00e9\\u{1F600}]", [](uint32_t c) {
    for (uint32_t m : {0x09u, 0x0Au, 0x0Du, 0x0Cu, 0x0Bu, 0x00u, 0x08u, 0x41u, 0xE9u, 0x1F600u}) {
      if (c == m) return true;
    }
    return false;
  }, {0x1F600});
  // Ranges of literal characters and of escapes, across UTF-8 lengths; a surrogate pair.
  expect_class("[α-ω]", [](uint32_t c) { return c >= 0x3B1 && c <= 0x3C9; }, {0x3B1, 0x3C9});
  expect_class("[^α-ω]", [](uint32_t c) { return !(c >= 0x3B1 && c <= 0x3C9); }, {0x3B1, 0x3C9});
  expect_class("[😀-🙏]", [](uint32_t c) { return c >= 0x1F600 && c <= 0x1F64F; }, {0x1F600, 0x1F64F});
  expect_class("[\\uD83D\\uDE00-\\uD83D\\uDE4F]", [](uint32_t c) { return c >= 0x1F600 && c <= 0x1F64F; },
               {0x1F600, 0x1F64F});
  expect_class("[\\x7e-\\u0801\\uFFF0-\\u{10010}]", [](uint32_t c) {
    return (c >= 0x7E && c <= 0x801) || (c >= 0xFFF0 && c <= 0x10010);
  }, {0x7E, 0x801, 0xFFF0, 0x10010});
  expect_class("[^\\x00-\\uFFFF]", [](uint32_t c) { return c > 0xFFFF; }, {0x10000});
}

TEST(RegexGrammar, LiteralsAndEscapes) {
  Pattern esc("\\t\\n\\r\\f\\v\\0\\x41\\u0042\\u{43}\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\\\\\/\\-\\ \\\"");
  ASSERT_TRUE(esc.ok());
  EXPECT_TRUE(esc.matches(std::string("\t\n\r\f\v") + '\0' + "ABC.*+?()[]{}|^$\\/- \""));
  EXPECT_FALSE(esc.matches(std::string("\t\n\r\f\v") + "0ABC.*+?()[]{}|^$\\/- \""));
  // Non-ASCII characters are themselves, repeated whole.
  Pattern uni("héllo 日本😀+");
  ASSERT_TRUE(uni.ok());
  EXPECT_TRUE(uni.matches("héllo 日本😀"));
  EXPECT_TRUE(uni.matches("héllo 日本😀😀😀"));
  EXPECT_FALSE(uni.matches("hello 日本😀"));
  EXPECT_FALSE(uni.matches("héllo 日本"));
  EXPECT_FALSE(uni.matches("héllo 日本😀\xF0\x9F\x98"));  // a partial character
  EXPECT_TRUE(uni.is_prefix("héllo 日本😀\xF0\x9F\x98"));
  // '.' is one character of any length, but not '\n'.
  Pattern dot("a.c");
  for (const char* ok : {"abc", "a c", "a\rc", "aéc", "a😀c", "a\tc"}) EXPECT_TRUE(dot.matches(ok)) << ok;
  for (const char* bad : {"a\nc", "ac", "abbc", "a\xF0\x9F\x98" "c"}) EXPECT_FALSE(dot.matches(bad)) << bad;
}

// json_string: each character is matched as a JSON string writes it.
TEST(RegexGrammar, JsonStringSpellsCharactersAsJsonDoes) {
  Pattern p("a\"b\\\\c\\nd\\x01é\\t\\u001F", json_string());
  ASSERT_TRUE(p.ok());
  EXPECT_TRUE(p.matches(R"(a\"b\\c\nd\u0001é\t\u001f)"));
  EXPECT_FALSE(p.matches("a\"b\\c\nd\x01\xC3\xA9\t\x1F"));            // the raw characters
  EXPECT_FALSE(p.matches(R"(a\"b\\c\nd\u0001é\t\u001F)"));            // the other hex case
  EXPECT_FALSE(p.matches(R"(a\u0022b\\c\nd\u0001é\t\u001f)"));        // another valid spelling
  EXPECT_FALSE(p.matches(R"(a\"b\\c\u000ad\u0001é\t\u001f)"));
  EXPECT_FALSE(p.matches(R"(a\"b\\c\nd\u0001\u00e9\t\u001f)"));
  // A class holds the spelled form of each of its characters, and nothing else.
  for (const char* cls : {"[^a]", ".", "[\\x00-\\x1f\"\\\\]", "[\\s\\S]", "[\\n-\\x22]", "\\W", "\\s"}) {
    Pattern c(cls, json_string());
    Pattern plain(cls);
    ASSERT_TRUE(c.ok() && plain.ok()) << cls;
    for (uint32_t cp : probes()) {
      // (JSON Schema's '.' is ECMAScript's: no line terminator at all; Python's excludes \n only.)
      const bool line_terminator = cp == '\r' || cp == 0x2028 || cp == 0x2029;
      const bool member = plain.matches(utf8(cp)) && !(std::string(cls) == "." && line_terminator);
      EXPECT_EQ(c.matches(json_spelling(cp)), member) << cls << " U+" << std::hex << cp;
      if (json_spelling(cp) != utf8(cp)) {
        EXPECT_FALSE(c.matches(utf8(cp))) << cls << " raw U+" << std::hex << cp;
      }
    }
    EXPECT_FALSE(c.matches("\\/")) << cls;  // JSON's other spellings are not the one spelling
    EXPECT_FALSE(c.matches("\\u0041")) << cls;
  }
  // A broad class is a few dozen alternatives (the escaped ones), not one per character.
  Pattern dot(".", json_string());
  size_t alternatives = 0;
  for (const Rule& r : dot.grammar().rules) alternatives += r.alternatives.size();
  EXPECT_LT(alternatives, 64u);
}

TEST(RegexGrammar, SearchMatchesAnywhereUnlessAnchored) {
  struct Case {
    const char* pattern;
    std::vector<std::string> yes, no;
  };
  const std::vector<Case> cases = {
      {"ab", {"ab", "xxab", "abyy", "xaby", "abab"}, {"", "a b", "ba", "a"}},
      {"^ab", {"ab", "abyy"}, {"xab", "xaby", ""}},
      {"ab$", {"ab", "xxab"}, {"aby", "xaby"}},
      {"^ab$", {"ab"}, {"xab", "aby", "abab"}},
      // '^' anchors the first alternative only, '$' the last only.
      {"^a|b$", {"a", "axx", "b", "xxb", "ab", "xbxb"}, {"xa", "bx", "", "xax"}},
      {"^a|b|c$", {"ax", "xbx", "xc"}, {"xa", "cx"}},
      {"", {"", "anything"}, {}},
      {"^$", {""}, {"x"}},
      {"a|$", {"", "xyz", "xay"}, {}},
      {"\\d{3}", {"123", "ab1234", "x999y"}, {"12", "1a2b3"}},
  };
  for (const Case& c : cases) {
    Pattern p(c.pattern, search());
    ASSERT_TRUE(p.ok()) << c.pattern;
    for (const std::string& s : c.yes) EXPECT_TRUE(p.matches(s)) << c.pattern << " vs '" << s << "'";
    for (const std::string& s : c.no) EXPECT_FALSE(p.matches(s)) << c.pattern << " vs '" << s << "'";
  }
  // With json_string, the text around is any JSON string content, spelled as JSON does.
  Pattern j("b", search(true));
  ASSERT_TRUE(j.ok());
  for (const char* ok : {"b", R"(a\"b\n)", R"(\u0001b\\)", "éb😀"}) EXPECT_TRUE(j.matches(ok)) << ok;
  for (const char* bad : {"a\"b", "b\n", "\\b", "b\\", R"(\u001Fb)", "a"}) EXPECT_FALSE(j.matches(bad)) << bad;
  Pattern ja("^a\"", search(true));
  EXPECT_TRUE(ja.matches(R"(a\"\"x)"));
  EXPECT_FALSE(ja.matches(R"(xa\")"));
}

// Random patterns over a small alphabet against std::regex (ECMAScript), whole-text and search,
// plain and json_string, on every text of up to four characters.
TEST(RegexGrammar, AgreesWithStdRegexOnRandomPatterns) {
  std::mt19937 rng(2024);
  const std::vector<std::string> atoms = {"a", "b", "1", ".", "[ab]", "[^a]", "[a-b1]", "\\d", "\\w", "\\W", "\\n"};
  const std::vector<std::string> quantifiers = {"", "", "", "*", "+", "?", "{2}", "{1,2}", "{0,}", "*?", "{0,2}?", "{0}"};
  auto pick = [&](const std::vector<std::string>& v) { return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(rng)]; };
  std::function<std::string(int)> alternation = [&](int depth) {
    std::string out;
    const int branches = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int b = 0; b < branches; ++b) {
      if (b > 0) out += '|';
      const int items = std::uniform_int_distribution<int>(0, 3)(rng);
      for (int i = 0; i < items; ++i) {
        const bool group = depth > 0 && std::uniform_int_distribution<int>(0, 3)(rng) == 0;
        out += group ? "(" + std::string(rng() % 2 ? "?:" : "") + alternation(depth - 1) + ")" : pick(atoms);
        out += pick(quantifiers);
      }
    }
    return out;
  };
  std::vector<std::string> texts = {""};
  for (size_t i = 0; i < texts.size() && texts[i].size() < 4; ++i) {
    for (char ch : std::string("ab1\n")) texts.push_back(texts[i] + ch);
  }
  for (int round = 0; round < 200; ++round) {
    std::string pattern = alternation(2);
    if (rng() % 3 == 0) pattern = "^" + pattern;
    if (rng() % 3 == 0) pattern += "$";
    const std::regex reference(pattern, std::regex::ECMAScript);
    Pattern whole(pattern), anywhere(pattern, search());
    // json_string: the same texts, each character spelled as JSON does (and a raw '\n' never).
    Pattern json(pattern, json_string()), json_anywhere(pattern, search(true));
    ASSERT_TRUE(whole.ok() && anywhere.ok() && json.ok() && json_anywhere.ok()) << pattern;
    for (const std::string& s : texts) {
      const bool match = std::regex_match(s, reference), found = std::regex_search(s, reference);
      ASSERT_EQ(whole.matches(s), match) << "/" << pattern << "/ vs '" << s << "'";
      ASSERT_EQ(anywhere.matches(s), found) << "/" << pattern << "/ searched in '" << s << "'";
      std::string spelled;
      for (char ch : s) spelled += json_spelling(static_cast<uint8_t>(ch));
      ASSERT_EQ(json.matches(spelled), match) << "/" << pattern << "/ vs JSON '" << spelled << "'";
      ASSERT_EQ(json_anywhere.matches(spelled), found) << "/" << pattern << "/ searched in JSON '" << spelled << "'";
      if (s.find('\n') != std::string::npos) {
        ASSERT_FALSE(json.matches(s) || json_anywhere.matches(s)) << pattern << " vs raw '" << s << "'";
      }
    }
  }
}

TEST(RegexGrammar, RefusedConstructsAreNamedWithTheirOffset) {
  EXPECT_NE(error_of("(?<n>a)(?<n>b)").find("group name 'n' at offset 10 is used twice"), std::string::npos)
      << error_of("(?<n>a)(?<n>b)");
  // Python's '.' (a regex structured output) takes '\r'; JSON Schema's does not (json_schema_test).
  EXPECT_TRUE(Pattern("a.b").matches("a\rb"));
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a(?=b)", "lookahead '(?=' at offset 1 is not supported"},
      {"a(?!b)", "negative lookahead '(?!' at offset 1 is not supported"},
      {"(?<=a)b", "lookbehind '(?<=' at offset 0 is not supported"},
      {"(?<!a)b", "negative lookbehind '(?<!' at offset 0 is not supported"},
      {"(a)\\1", "backreference '\\1' at offset 3 is not supported"},
      {"(a)\\12", "backreference '\\12' at offset 3 is not supported"},
      {"(?<n>a)\\k<n>", "backreference '\\k' at offset 7 is not supported"},
      {"(?P<n>a)(?P=n)", "backreference '(?P=' at offset 8 is not supported"},
      {"\\bword", "word boundary '\\b' at offset 0 is not supported"},
      {"a\\B", "word boundary '\\B' at offset 1 is not supported"},
      {"(?i)abc", "inline flags '(?i)' at offset 0 are not supported"},
      {"x(?im-s:abc)", "inline flags '(?im-s:' at offset 1 are not supported"},
      {"(?#note)", "comment group '(?#' at offset 0 is not supported"},
      {"(?>a)", "atomic group '(?>' at offset 0 is not supported"},
      {"(a)(?(1)b)", "conditional group '(?(' at offset 3 is not supported"},
      {"(?<1a>x)", "named group '(?<1a>' at offset 0 needs a name of letters, digits and '_' and then '>'"},
      {"a*+", "possessive quantifier '*+' at offset 1 is not supported"},
      {"a{2}+", "possessive quantifier '{2}+' at offset 1 is not supported"},
      {"(ab", "unbalanced '(' at offset 0 has no ')' to close it"},
      {"(a(b)", "unbalanced '(' at offset 0 has no ')' to close it"},
      {"ab)", "unbalanced ')' at offset 2 closes no '('"},
      {"[]", "empty class '[]' at offset 0 is not supported"},
      {"[^]", "empty class '[^]' at offset 0 is not supported"},
      {"x[z-a]", "class range 'z-a' at offset 2 ends before it starts"},
      {"[a-\\d]", "class range 'a-\\d' at offset 1 has a class escape for an end"},
      {"[^\\s\\S]", "class '[^\\s\\S]' at offset 0 matches no character"},
      {"[abc", "unterminated class '[' at offset 0"},
      {"*a", "quantifier '*' at offset 0 has nothing to repeat"},
      {"a|+b", "quantifier '+' at offset 2 has nothing to repeat"},
      {"(?:?)", "quantifier '?' at offset 3 has nothing to repeat"},
      {"^*", "quantifier '*' at offset 1 has nothing to repeat"},
      {"{2}", "quantifier '{2}' at offset 0 has nothing to repeat"},
      {"a**", "quantifier '*' at offset 2 follows another quantifier"},
      {"a{2}{3}", "quantifier '{3}' at offset 4 follows another quantifier"},
      {"a{,2}", "quantifier '{,' at offset 1 has no minimum (write {0,n})"},
      {"a{x}", "brace '{' at offset 1 starts no quantifier {m}, {m,} or {m,n} (write '\\{' for the character)"},
      {"a{3,2}", "quantifier '{3,2}' at offset 1 has its maximum below its minimum"},
      {"a{1,100000}", "quantifier '{1,100000}' at offset 1 is over the limit of 10000 repetitions"},
      {"a{10001}", "quantifier '{10001}' at offset 1 is over the limit of 10000 repetitions"},
      {"a^b", "anchor '^' at offset 1 is only supported at the start of the pattern"},
      {"(^a)", "anchor '^' at offset 1 is only supported at the start of the pattern"},
      {"a|^b", "anchor '^' at offset 2 is only supported at the start of the pattern"},
      {"a$b", "anchor '$' at offset 1 is only supported at the end of the pattern"},
      {"(a$)", "anchor '$' at offset 2 is only supported at the end of the pattern"},
      {"a$|b", "anchor '$' at offset 1 is only supported at the end of the pattern"},
      {"\\Aa", "anchor '\\A' at offset 0 is not supported"},
      {"a\\Z", "anchor '\\Z' at offset 1 is not supported"},
      {"\\p{L}", "Unicode property escape '\\p' at offset 0 is not supported"},
      {"\\q", "unknown escape '\\q' at offset 0"},
      {"\\é", "unknown escape '\\é' at offset 0"},
      {"a\\", "escape '\\' at offset 1 ends the pattern"},
      {"\\x4g", "escape '\\x4g' at offset 0 needs 2 hex digits"},
      {"\\u12", "escape '\\u12' at offset 0 needs 4 hex digits"},
      {"\\uD800", "escape '\\uD800' at offset 0 is a lone surrogate"},
      {"[\\uDC00]", "escape '\\uDC00' at offset 1 is a lone surrogate"},
      {"\\u{110000}", "escape '\\u{110000}' at offset 0 needs 1 to 6 hex digits up to 10FFFF and a '}'"},
      {"\\u{}", "escape '\\u{}' at offset 0 needs 1 to 6 hex digits up to 10FFFF and a '}'"},
      {"\\01", "octal escape '\\01' at offset 0 is not supported"},
      {"ab\xC3", "the pattern is not UTF-8 at offset 2"},
      {"\xED\xA0\x80", "the pattern is not UTF-8 at offset 0"},  // a surrogate
      {"a\xC0\x80", "the pattern is not UTF-8 at offset 1"},     // overlong
      {"[a\xFF]", "the pattern is not UTF-8 at offset 2"},
  };
  for (const auto& [pattern, message] : cases) {
    EXPECT_EQ(error_of(pattern), "regex: " + message) << pattern;
    // The same in every mode, and through regex_grammar().
    EXPECT_EQ(error_of(pattern, search(true)), "regex: " + message) << pattern;
    Result<Grammar> g = regex_grammar(pattern);
    EXPECT_EQ(g.ok() ? std::string("(accepted)") : g.status().message(), "regex: " + message) << pattern;
  }
}

TEST(RegexGrammar, HostilePatternsAreRefusedOrBounded) {
  // Nesting: 200 groups deep is the limit.
  EXPECT_EQ(error_of(std::string(300, '(') + "a" + std::string(300, ')')),
            "regex: group '(' at offset 200 is nested deeper than 200 groups");
  Pattern deep(std::string(200, '(') + "a" + std::string(200, ')') + "b");
  EXPECT_TRUE(deep.matches("ab"));
  Pattern deep_star(std::string(150, '(') + "a*" + std::string(150, ')') + "*");
  EXPECT_TRUE(deep_star.matches("aaa"));
  EXPECT_NE(error_of("a{1,99999999999999999999999}").find("is over the limit of 10000 repetitions"), std::string::npos);
  // Many large repetitions: refused once the grammar would be too large, before it is built.
  std::string many;
  for (int i = 0; i < 120; ++i) many += "a{10000}";
  EXPECT_EQ(error_of(many), "regex: '{10000}' at offset 793 makes the grammar too large (over 1000000 items or 100000 rules)");
  std::string optional_runs;
  for (int i = 0; i < 11; ++i) optional_runs += "a{0,10000}";
  EXPECT_NE(error_of(optional_runs).find("makes the grammar too large"), std::string::npos);
  // A long run of optional items under a star (each a way for the repeated part to start).
  std::string optionals = "(?:";
  for (int i = 0; i < 20000; ++i) optionals += "a?";
  EXPECT_NE(error_of(optionals + ")*").find("makes the grammar too large"), std::string::npos);
  // 100 KB of alternatives, and 100 KB of one literal, compile and match.
  std::string words;
  for (int i = 0; words.size() < 100000; ++i) words += (i ? "|w" : "w") + std::to_string(i);
  Pattern alternatives(words);
  EXPECT_TRUE(alternatives.matches("w12345"));
  EXPECT_FALSE(alternatives.matches("w123456"));
  Pattern literal(std::string(100000, 'x'));
  EXPECT_TRUE(literal.matches(std::string(100000, 'x')));
  EXPECT_FALSE(literal.matches(std::string(99999, 'x')));
}

TEST(RegexGrammar, AddRegexSharesABuilder) {
  // Two patterns in one grammar, each under rules named from its hint.
  GrammarBuilder b;
  Result<Element> year = add_regex(b, "\\d{4}", {}, "year");
  Result<Element> word = add_regex(b, "[a-z]+", {}, "word");
  ASSERT_TRUE(year.ok() && word.ok());
  EXPECT_EQ(b.name(year->index).rfind("year", 0), 0u);
  EXPECT_EQ(b.name(word->index).rfind("word", 0), 0u);
  // A refused pattern leaves the builder usable (no rule left without alternatives).
  std::string big;
  for (int i = 0; i < 120; ++i) big += "a{10000}";
  EXPECT_FALSE(add_regex(b, big, {}, "big").ok());
  EXPECT_FALSE(add_regex(b, "(?=x)", {}, "bad").ok());
  const int32_t root = b.rule("root");
  b.add_alternative(root, {*year, b.byte('-'), *word});
  Result<Grammar> g = std::move(b).build(root);
  ASSERT_TRUE(g.ok()) << g.status().message();
  auto compiled = std::make_shared<const CompiledGrammar>(std::move(*g));
  GrammarMatcher m(compiled);
  EXPECT_TRUE(m.accept("2024-abc") && m.can_end());
  GrammarMatcher bad(compiled);
  EXPECT_FALSE(bad.accept("202-abc") && bad.can_end());
}

}  // namespace
}  // namespace pagoda::structured
