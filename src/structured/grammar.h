// Grammar: the one form every structured-output constraint compiles to (a JSON schema, a regex, a
// choice list, a GBNF grammar): a context-free grammar over bytes.
//
// A rule is a list of alternatives; an alternative is a sequence of elements, each a set of bytes
// (one byte of input) or a reference to a rule. Text is matched as UTF-8 bytes, so a character
// class over code points becomes alternatives of byte sequences (add_code_points), and a token
// that holds part of a character (a byte-fallback token) is matched like any other bytes.
// Repetition is rules too: x* is R ::= x R | (empty), which GrammarBuilder::repeat writes.
//
// Immutable once built (GrammarBuilder::build checks it): every reference names a rule, and no
// rule is left-recursive (the matcher expands references depth-first, as llama.cpp's does).
// Thread-safe to share.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace pagoda::structured {

// A set of byte values.
struct ByteSet {
  std::array<uint64_t, 4> bits{};

  bool has(uint8_t b) const { return (bits[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { bits[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool empty() const { return (bits[0] | bits[1] | bits[2] | bits[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
};

struct Element {
  enum class Kind : uint8_t { kBytes, kRule };
  Kind kind = Kind::kBytes;
  int32_t index = 0;  // into Grammar::byte_sets (kBytes) or Grammar::rules (kRule)
  bool operator==(const Element&) const = default;
};

using Alternative = std::vector<Element>;  // empty: matches the empty string

struct Rule {
  std::string name;
  std::vector<Alternative> alternatives;
};

struct Grammar {
  std::vector<Rule> rules;
  std::vector<ByteSet> byte_sets;
  int32_t root = 0;

  // The grammar in GBNF notation, one rule a line (byte sets as [\xHH-\xHH] classes): for error
  // messages and tests.
  std::string to_string() const;
};

// Writes a Grammar: rules are added by name (a reference may come before its rule), and the
// helpers add the rules that repetition and character classes need.
class GrammarBuilder {
 public:
  // The id of rule `name`, adding it (without alternatives yet) when new.
  int32_t rule(const std::string& name);
  // A new rule with a fresh name made from `hint` (e.g. "value-star-3").
  int32_t fresh_rule(const std::string& hint);
  void add_alternative(int32_t rule, Alternative alt);
  bool has_alternatives(int32_t rule) const { return !rules_[static_cast<size_t>(rule)].alternatives.empty(); }
  const std::string& name(int32_t rule) const { return rules_[static_cast<size_t>(rule)].name; }

  Element bytes(const ByteSet& set);  // one byte of `set`
  Element byte(uint8_t b);
  static Element ref(int32_t rule) { return Element{Element::Kind::kRule, rule}; }
  // The elements that match `text` exactly.
  Alternative literal(std::string_view text);
  // A rule matching one character (UTF-8) whose code point is in one of the closed ranges
  // (surrogates are never matched; ranges may overlap and need no order).
  Element code_points(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, const std::string& hint);
  // A rule matching `item` repeated min..max times (max < 0: no limit), built from right
  // recursion and nested options, so that no rule is left-recursive. Bounds above kMaxRepeat
  // make build() fail.
  Element repeat(const Alternative& item, int64_t min, int64_t max, const std::string& hint);

  // The grammar rooted at `root`; fails when a referenced rule was never given alternatives
  // (naming it), when a rule is left-recursive (naming the cycle), or when it has more than
  // `max_rules` rules.
  Result<Grammar> build(int32_t root, size_t max_rules = kMaxRules) &&;

  static constexpr size_t kMaxRules = 100000;
  static constexpr int64_t kMaxRepeat = 10000;

 private:
  std::vector<Rule> rules_;
  std::vector<ByteSet> sets_;
  std::unordered_map<std::string, int32_t> by_name_;
  int64_t fresh_ = 0;
  std::string error_;  // the first limit a helper hit (build() returns it)
};

// The same language with small rules written into the alternatives that use them: a rule that
// is not recursive, not the root, and small (a character class, a group, an escape) is replaced
// by its alternatives where it is used (one of several alternatives only where it starts an
// alternative), while the rule using it stays small too. Token masks cache what a
// token does from each position until the position's rule ends (token_grammar.h), so a rule that
// ends after one character would leave almost every token to be checked again at run time.
Grammar inline_small_rules(Grammar g);

// The UTF-8 bytes of a code point (a Unicode scalar value).
std::string utf8_encode(uint32_t code_point);

// The code points of a negated class: everything in [0, 0x10FFFF] outside `ranges`.
std::vector<std::pair<uint32_t, uint32_t>> complement_code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges);

}  // namespace pagoda::structured
