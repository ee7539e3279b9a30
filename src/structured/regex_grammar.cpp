#include "structured/regex_grammar.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/unicode.h"

namespace pagoda::structured {
namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // closed code point ranges

constexpr int kMaxNesting = 200;  // groups within groups (the parser and the emitter recurse on them)
// What one pattern may add to a builder before it is refused: repetitions copy their item and add
// rules per optional copy, so a short pattern could otherwise ask for gigabytes.
constexpr int64_t kMaxItems = 1'000'000;
constexpr int64_t kMaxRules = static_cast<int64_t>(GrammarBuilder::kMaxRules);
// A repeated item longer than this is made a rule first, so that its copies are one reference.
constexpr size_t kMaxCopiedItems = 4;
constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

// Sorted, merged, and without the surrogates (which no UTF-8 text holds).
Ranges normalize(Ranges r) {
  Ranges split;
  for (auto [lo, hi] : r) {
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) continue;
    if (lo < kSurrogateLo) split.emplace_back(lo, std::min(hi, kSurrogateLo - 1));
    if (hi > kSurrogateHi) split.emplace_back(std::max(lo, kSurrogateHi + 1), hi);
  }
  std::sort(split.begin(), split.end());
  Ranges out;
  for (auto [lo, hi] : split) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

Ranges complement(Ranges r) { return normalize(complement_code_points(std::move(r))); }

Ranges digit_ranges() { return {{'0', '9'}}; }
Ranges word_ranges() { return {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}; }
// ECMAScript's \s (WhiteSpace and LineTerminator), JSON Schema's dialect.
Ranges space_ranges() {
  return {{0x09, 0x0D}, {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680}, {0x2000, 0x200A},
          {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
}

// How a character is written inside a JSON string: the one spelling JSON writers use.
std::string json_form(uint32_t c) {
  switch (c) {
    case '"': return "\\\"";
    case '\\': return "\\\\";
    case 0x08: return "\\b";
    case 0x0C: return "\\f";
    case 0x0A: return "\\n";
    case 0x0D: return "\\r";
    case 0x09: return "\\t";
    default: break;
  }
  if (c < 0x20) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "\\u%04x", c);
    return buf;
  }
  return utf8_encode(c);
}

// The code points JSON writes escaped: the controls, '"' and '\'.
bool json_escaped(uint32_t c) { return c < 0x20 || c == '"' || c == '\\'; }

bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
uint32_t hex_value(char c) {
  return static_cast<uint32_t>(c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10);
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_alnum(char c) { return is_digit(c) || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z'); }

// The pattern read into a tree, before any rule is written: repetition of something that can
// match the empty string needs to know that (see RegexEmitter::nonempty).
struct Node {
  enum class Kind : uint8_t { kEmpty, kChars, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kEmpty;
  bool nullable = true;      // matches the empty string
  size_t begin = 0, end = 0;  // its text in the pattern (for kRepeat, the quantifier's)
  Ranges chars;               // kChars: normalized, never empty
  std::vector<int32_t> children;
  int64_t min = 1, max = 1;  // kRepeat; max < 0: no limit
};

struct Ast {
  std::vector<Node> nodes;
  std::vector<int32_t> branches;  // the top-level alternatives
  bool anchored_start = false;    // '^' first: anchors the first branch
  bool anchored_end = false;      // '$' last: anchors the last branch
};

// A class item: one code point (a possible range end) or a class escape's set.
struct ClassAtom {
  Ranges ranges;
  bool single = false;
};

class RegexParser {
 public:
  // `ecmascript`: '.' is ECMAScript's (JSON Schema's dialect), which excludes every line
  // terminator: \n, \r, U+2028 and U+2029; otherwise Python's, which excludes \n only.
  RegexParser(std::string_view pattern, bool ecmascript) : p_(pattern), ecmascript_(ecmascript) {}

  Result<Ast> parse() {
    if (peek() == '^') {
      ast_.anchored_start = true;
      ++pos_;
    }
    ast_.branches = parse_branches(0);
    // At depth 0 the branches end only at the end of the pattern or at a ')'.
    if (!error_ && !eof()) fail("unbalanced", pos_, pos_ + 1, " closes no '('");
    if (error_) return invalid_argument(*error_);
    return std::move(ast_);
  }

 private:
  bool eof() const { return pos_ >= p_.size(); }
  char peek(size_t ahead = 0) const { return pos_ + ahead < p_.size() ? p_[pos_ + ahead] : '\0'; }

  // "regex: <what> '<text>' at offset N<rest>", the pattern's text shortened when long.
  void fail(const std::string& what, size_t begin, size_t end, const std::string& rest) {
    if (error_) return;
    end = std::min(end, p_.size());
    std::string text(p_.substr(begin, std::min<size_t>(end - begin, 32)));
    if (end - begin > 32) text += "...";
    error_ = "regex: " + what + " '" + text + "' at offset " + std::to_string(begin) + rest;
  }

  int32_t add(Node n) {
    ast_.nodes.push_back(std::move(n));
    return static_cast<int32_t>(ast_.nodes.size() - 1);
  }
  const Node& node(int32_t id) const { return ast_.nodes[static_cast<size_t>(id)]; }

  int32_t chars(Ranges r, size_t begin) {
    Node n{Node::Kind::kChars, false, begin, pos_, std::move(r), {}, 1, 1};
    return add(std::move(n));
  }

  std::vector<int32_t> parse_branches(int depth) {
    std::vector<int32_t> branches;
    while (!error_) {
      branches.push_back(parse_sequence(depth));
      if (peek() != '|') break;
      ++pos_;
    }
    return branches;
  }

  int32_t parse_sequence(int depth) {
    const size_t begin = pos_;
    std::vector<int32_t> items;
    while (!error_ && !eof()) {
      const char c = peek();
      if (c == '|' || c == ')') break;
      if (c == '$' && depth == 0 && pos_ + 1 == p_.size()) {
        ast_.anchored_end = true;
        ++pos_;
        break;
      }
      const int32_t atom = parse_quantifiers(parse_atom(depth));
      if (error_) return -1;
      // A group's sequence is written into the one holding it (nested groups stay linear).
      if (node(atom).kind == Node::Kind::kSeq) {
        const std::vector<int32_t> inner = node(atom).children;
        items.insert(items.end(), inner.begin(), inner.end());
      } else {
        items.push_back(atom);
      }
    }
    if (items.size() == 1) return items[0];
    Node n{items.empty() ? Node::Kind::kEmpty : Node::Kind::kSeq, true, begin, pos_, {}, {}, 1, 1};
    for (int32_t i : items) n.nullable = n.nullable && node(i).nullable;
    n.children = std::move(items);
    return add(std::move(n));
  }

  int32_t parse_atom(int depth) {
    const size_t begin = pos_;
    switch (peek()) {
      case '(': return parse_group(depth);
      case '[': return parse_class();
      case '.':
        ++pos_;
        if (ecmascript_) {
          return chars(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}), begin);
        }
        return chars(normalize({{0, '\n' - 1}, {'\n' + 1, kMaxCodePoint}}), begin);
      case '\\': {
        std::optional<ClassAtom> e = parse_escape(/*in_class=*/false);
        return e ? chars(normalize(std::move(e->ranges)), begin) : -1;
      }
      case '*': case '+': case '?':
        return fail("quantifier", begin, begin + 1, " has nothing to repeat"), -1;
      case '{': {
        int64_t min = 0, max = 0;
        if (parse_braces(min, max)) fail("quantifier", begin, pos_, " has nothing to repeat");
        return -1;
      }
      case '^': return fail("anchor", begin, begin + 1, " is only supported at the start of the pattern"), -1;
      case '$': return fail("anchor", begin, begin + 1, " is only supported at the end of the pattern"), -1;
      default: {
        const std::optional<uint32_t> c = parse_utf8();
        return c ? chars({{*c, *c}}, begin) : -1;
      }
    }
  }

  int32_t parse_group(int depth) {
    const size_t begin = pos_;
    if (depth >= kMaxNesting) {
      return fail("group", begin, begin + 1, " is nested deeper than " + std::to_string(kMaxNesting) + " groups"), -1;
    }
    ++pos_;
    if (peek() == '?' && !parse_group_kind(begin)) return -1;
    const std::vector<int32_t> branches = parse_branches(depth + 1);
    if (error_) return -1;
    if (peek() != ')') return fail("unbalanced", begin, begin + 1, " has no ')' to close it"), -1;
    ++pos_;
    if (branches.size() == 1) return branches[0];
    Node n{Node::Kind::kAlt, false, begin, pos_, {}, branches, 1, 1};
    for (int32_t b : branches) n.nullable = n.nullable || node(b).nullable;
    return add(std::move(n));
  }

  // After "(?": moves past the non-capturing or named group's opening, or refuses what follows.
  bool parse_group_kind(size_t begin) {
    const std::string_view rest = p_.substr(pos_ + 1);
    auto refuse = [&](const char* what, size_t len) {
      fail(what, begin, begin + 2 + len, " is not supported");
      return false;
    };
    if (rest.starts_with(':')) {
      pos_ += 2;
      return true;
    }
    if (rest.starts_with("<=")) return refuse("lookbehind", 2);
    if (rest.starts_with("<!")) return refuse("negative lookbehind", 2);
    if (rest.starts_with('=')) return refuse("lookahead", 1);
    if (rest.starts_with('!')) return refuse("negative lookahead", 1);
    if (rest.starts_with("P=")) return refuse("backreference", 2);
    if (rest.starts_with('#')) return refuse("comment group", 1);
    if (rest.starts_with('>')) return refuse("atomic group", 1);
    if (rest.starts_with('(')) return refuse("conditional group", 1);
    if (rest.starts_with('<') || rest.starts_with("P<")) {
      pos_ += rest.starts_with('<') ? 2 : 3;
      const size_t name = pos_;
      while (!eof() && (is_alnum(peek()) || peek() == '_')) ++pos_;
      if (pos_ == name || is_digit(p_[name]) || peek() != '>') {
        fail("named group", begin, pos_ + 1, " needs a name of letters, digits and '_' and then '>'");
        return false;
      }
      if (!group_names_.insert(std::string(p_.substr(name, pos_ - name))).second) {
        fail("group name", name, pos_, " is used twice");
        return false;
      }
      ++pos_;
      return true;
    }
    size_t flags = 0;
    while (flags < rest.size() && (is_alnum(rest[flags]) || rest[flags] == '-')) ++flags;
    if (flags > 0) {
      if (flags < rest.size() && (rest[flags] == ')' || rest[flags] == ':')) ++flags;
      fail("inline flags", begin, begin + 2 + flags, " are not supported");
      return false;
    }
    return refuse("group", 1);
  }

  int32_t parse_class() {
    const size_t begin = pos_;
    ++pos_;
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    if (peek() == ']') return fail("empty class", begin, pos_ + 1, " is not supported"), -1;
    Ranges ranges;
    while (true) {
      if (eof()) return fail("unterminated class", begin, begin + 1, ""), -1;
      if (peek() == ']') break;
      const size_t item = pos_;
      const std::optional<ClassAtom> lo = parse_class_atom();
      if (!lo) return -1;
      if (peek() != '-' || pos_ + 1 >= p_.size() || peek(1) == ']') {  // '-' last is itself
        ranges.insert(ranges.end(), lo->ranges.begin(), lo->ranges.end());
        continue;
      }
      ++pos_;
      const std::optional<ClassAtom> hi = parse_class_atom();
      if (!hi) return -1;
      if (!lo->single || !hi->single) return fail("class range", item, pos_, " has a class escape for an end"), -1;
      if (hi->ranges[0].first < lo->ranges[0].first) return fail("class range", item, pos_, " ends before it starts"), -1;
      ranges.emplace_back(lo->ranges[0].first, hi->ranges[0].first);
    }
    ++pos_;
    ranges = negated ? complement(std::move(ranges)) : normalize(std::move(ranges));
    if (ranges.empty()) return fail("class", begin, pos_, " matches no character"), -1;
    return chars(std::move(ranges), begin);
  }

  std::optional<ClassAtom> parse_class_atom() {
    if (peek() == '\\') return parse_escape(/*in_class=*/true);
    const std::optional<uint32_t> c = parse_utf8();
    if (!c) return std::nullopt;
    return ClassAtom{{{*c, *c}}, true};
  }

  std::optional<ClassAtom> parse_escape(bool in_class) {
    const size_t begin = pos_;
    ++pos_;
    if (eof()) return fail("escape", begin, begin + 1, " ends the pattern"), std::nullopt;
    const char e = p_[pos_++];
    auto one = [](uint32_t c) { return ClassAtom{{{c, c}}, true}; };
    auto refuse = [&](const char* what) { return fail(what, begin, pos_, " is not supported"), std::nullopt; };
    switch (e) {
      case 'd': return ClassAtom{digit_ranges()};
      case 'D': return ClassAtom{complement(digit_ranges())};
      case 'w': return ClassAtom{word_ranges()};
      case 'W': return ClassAtom{complement(word_ranges())};
      case 's': return ClassAtom{space_ranges()};
      case 'S': return ClassAtom{complement(space_ranges())};
      case 't': return one('\t');
      case 'n': return one('\n');
      case 'r': return one('\r');
      case 'f': return one('\f');
      case 'v': return one('\v');
      case 'b': return in_class ? std::optional(one('\b')) : refuse("word boundary");
      case 'B': return refuse("word boundary");
      case 'A': case 'Z': case 'z': case 'G': return refuse("anchor");
      case 'p': case 'P': return refuse("Unicode property escape");
      case 'k': return refuse("backreference");
      case '0':
        if (is_digit(peek())) return ++pos_, refuse("octal escape");
        return one(0);
      case 'x': return parse_hex_escape(begin, 2);
      case 'u': return peek() == '{' ? parse_braced_hex_escape(begin) : parse_hex_escape(begin, 4);
      default: break;
    }
    if (is_digit(e)) {  // \1..\9 (inside a class, octal in both dialects)
      while (is_digit(peek())) ++pos_;
      return refuse(in_class ? "octal escape" : "backreference");
    }
    if (e >= 0x20 && e < 0x7F && !is_alnum(e)) return one(static_cast<uint32_t>(e));  // escaped punctuation
    while ((static_cast<unsigned char>(peek()) & 0xC0) == 0x80) ++pos_;  // show a whole UTF-8 character
    return fail("unknown escape", begin, pos_, ""), std::nullopt;
  }

  // \xHH or \uHHHH, a UTF-16 surrogate pair \uHHHH\uHHHH read as the one character it encodes.
  std::optional<ClassAtom> parse_hex_escape(size_t begin, int digits) {
    std::optional<uint32_t> c = read_hex(digits);
    if (!c) return fail("escape", begin, pos_ + 1, " needs " + std::to_string(digits) + " hex digits"), std::nullopt;
    if (digits == 4 && *c >= kSurrogateLo && *c < 0xDC00 && peek() == '\\' && peek(1) == 'u') {
      const size_t save = pos_;
      pos_ += 2;
      const std::optional<uint32_t> low = read_hex(4);
      if (low && *low >= 0xDC00 && *low <= kSurrogateHi) {
        c = 0x10000 + ((*c - kSurrogateLo) << 10) + (*low - 0xDC00);
      } else {
        pos_ = save;
      }
    }
    if (*c >= kSurrogateLo && *c <= kSurrogateHi) return fail("escape", begin, pos_, " is a lone surrogate"), std::nullopt;
    return ClassAtom{{{*c, *c}}, true};
  }

  // \u{H...}: one to six hex digits, at most 10FFFF.
  std::optional<ClassAtom> parse_braced_hex_escape(size_t begin) {
    ++pos_;
    uint32_t c = 0;
    size_t digits = 0;
    for (; is_hex(peek()) && digits < 7; ++digits, ++pos_) c = c * 16 + hex_value(peek());
    if (digits == 0 || digits > 6 || peek() != '}' || c > kMaxCodePoint) {
      return fail("escape", begin, pos_ + 1, " needs 1 to 6 hex digits up to 10FFFF and a '}'"), std::nullopt;
    }
    ++pos_;
    if (c >= kSurrogateLo && c <= kSurrogateHi) return fail("escape", begin, pos_, " is a lone surrogate"), std::nullopt;
    return ClassAtom{{{c, c}}, true};
  }

  std::optional<uint32_t> read_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      if (!is_hex(peek())) return std::nullopt;
      v = v * 16 + hex_value(peek());
      ++pos_;
    }
    return v;
  }

  // One UTF-8 character of the pattern: shortest form, no surrogates, at most U+10FFFF.
  std::optional<uint32_t> parse_utf8() {
    const unicode::Utf8Step step = unicode::decode_utf8(p_, pos_);
    if (!step.valid) {
      if (!error_) error_ = "regex: the pattern is not UTF-8 at offset " + std::to_string(pos_);
      return std::nullopt;
    }
    pos_ += step.length;
    return static_cast<uint32_t>(step.code_point);
  }

  // Quantifiers after an atom, each making a repetition node.
  int32_t parse_quantifiers(int32_t atom) {
    bool quantified = false;
    while (atom >= 0 && !error_) {
      const size_t begin = pos_;
      int64_t min = 0, max = -1;
      const char c = peek();
      if (c == '*') {
        ++pos_;
      } else if (c == '+') {
        min = 1, ++pos_;
      } else if (c == '?') {
        max = 1, ++pos_;
      } else if (c != '{' || !parse_braces(min, max)) {
        break;
      }
      if (quantified) return fail("quantifier", begin, pos_, " follows another quantifier"), -1;
      quantified = true;
      if (peek() == '?') {
        ++pos_;  // lazy: the same language
      } else if (peek() == '+') {
        return fail("possessive quantifier", begin, pos_ + 1, " is not supported"), -1;
      }
      const Node& item = node(atom);
      Node n{Node::Kind::kRepeat, min == 0 || item.nullable, begin, pos_, {}, {atom}, min, max};
      atom = add(std::move(n));
    }
    return error_ ? -1 : atom;
  }

  // {m}, {m,} or {m,n} at pos_: true and past it with the bounds, or false with an error.
  bool parse_braces(int64_t& min, int64_t& max) {
    const size_t begin = pos_;
    ++pos_;
    const std::optional<int64_t> lo = read_count();
    std::optional<int64_t> hi = lo;
    if (lo && peek() == ',') {
      ++pos_;
      hi = is_digit(peek()) ? read_count() : std::optional<int64_t>(-1);
    }
    if (!lo || peek() != '}') {
      if (!lo && peek() == ',') return fail("quantifier", begin, pos_ + 1, " has no minimum (write {0,n})"), false;
      fail("brace", begin, begin + 1, " starts no quantifier {m}, {m,} or {m,n} (write '\\{' for the character)");
      return false;
    }
    ++pos_;
    min = *lo;
    max = *hi;
    if (min > GrammarBuilder::kMaxRepeat || max > GrammarBuilder::kMaxRepeat) {
      fail("quantifier", begin, pos_, " is over the limit of " + std::to_string(GrammarBuilder::kMaxRepeat) + " repetitions");
      return false;
    }
    if (max >= 0 && max < min) return fail("quantifier", begin, pos_, " has its maximum below its minimum"), false;
    return true;
  }

  // Decimal digits, saturating just past kMaxRepeat (the caller refuses that).
  std::optional<int64_t> read_count() {
    if (!is_digit(peek())) return std::nullopt;
    int64_t v = 0;
    while (is_digit(peek())) {
      v = std::min(v * 10 + (peek() - '0'), GrammarBuilder::kMaxRepeat + 1);
      ++pos_;
    }
    return v;
  }

  std::string_view p_;
  bool ecmascript_;
  size_t pos_ = 0;
  Ast ast_;
  std::optional<std::string> error_;
  std::set<std::string> group_names_;
};

// Writes the tree as rules. A node becomes a sequence of elements: characters their bytes (or a
// class rule), a group of alternatives a rule, a repetition GrammarBuilder::repeat's rule. Rules
// are made only once their alternatives are known, so that a refusal part way leaves `b` with
// unused rules but none undefined.
class RegexEmitter {
 public:
  RegexEmitter(GrammarBuilder& b, const Ast& ast, std::string_view pattern, const RegexOptions& options,
               const std::string& hint)
      : b_(b), ast_(ast), p_(pattern), options_(options), hint_(hint),
        emitted_(ast.nodes.size()), nonempty_(ast.nodes.size()) {}

  Result<Element> emit_root() {
    const size_t k = ast_.branches.size();
    // Search: any text may come before a branch unless '^' anchors it, and after unless '$' does
    // ('^' belongs to the first branch only, '$' to the last, as in both dialects).
    auto before = [&](size_t i) { return options_.search && !(i == 0 && ast_.anchored_start); };
    auto after = [&](size_t i) { return options_.search && !(i + 1 == k && ast_.anchored_end); };
    bool uniform = true;
    for (size_t i = 1; i < k; ++i) uniform = uniform && before(i) == before(0) && after(i) == after(0);
    std::vector<Alternative> alts;
    if (uniform && (before(0) || after(0))) {
      std::vector<Alternative> bodies;
      for (int32_t br : ast_.branches) bodies.push_back(emit(br));
      alts.push_back(wrap(bodies.size() == 1 ? bodies[0] : Alternative{rule_of(bodies, "group")}, before(0), after(0)));
    } else {
      for (size_t i = 0; i < k; ++i) alts.push_back(wrap(emit(ast_.branches[i]), before(i), after(i)));
    }
    if (error_) return invalid_argument(*error_);
    const int32_t root = b_.fresh_rule(hint_);
    for (Alternative& a : alts) b_.add_alternative(root, std::move(a));
    return GrammarBuilder::ref(root);
  }

 private:
  const Node& node(int32_t id) const { return ast_.nodes[static_cast<size_t>(id)]; }

  // Counts what a node adds; false (and the error) once over the limits.
  bool charge(int64_t items, int64_t rules, const Node& n) {
    items_ += items;
    rules_ += rules;
    if (items_ <= kMaxItems && rules_ <= kMaxRules) return true;
    if (!error_) {
      std::string text(p_.substr(n.begin, std::min<size_t>(n.end - n.begin, 32)));
      if (n.end - n.begin > 32) text += "...";
      error_ = "regex: '" + text + "' at offset " + std::to_string(n.begin) + " makes the grammar too large (over " +
               std::to_string(kMaxItems) + " items or " + std::to_string(kMaxRules) + " rules)";
    }
    return false;
  }

  // `body` with any text allowed before and/or after it.
  Alternative wrap(Alternative body, bool before, bool after) {
    if (!before && !after) return body;
    Alternative out;
    if (before) out.push_back(any_text());
    out.insert(out.end(), body.begin(), body.end());
    if (after && !(before && body.empty())) out.push_back(any_text());
    return out;
  }

  // Any sequence of characters (in their JSON form for json_string).
  Element any_text() {
    if (!any_text_) {
      const Alternative any = chars(normalize({{0, kMaxCodePoint}}));
      any_text_ = b_.repeat(any, 0, -1, hint_ + "-any");
    }
    return *any_text_;
  }

  // One element for several alternatives: the element itself when it is all there is.
  Element rule_of(const std::vector<Alternative>& alts, const std::string& what) {
    if (alts.size() == 1 && alts[0].size() == 1) return alts[0][0];
    const int32_t r = b_.fresh_rule(hint_ + "-" + what);
    for (const Alternative& a : alts) b_.add_alternative(r, a);
    ++rules_;
    return GrammarBuilder::ref(r);
  }

  // The elements matching node `id`.
  Alternative emit(int32_t id) {
    if (error_) return {};
    std::optional<Alternative>& memo = emitted_[static_cast<size_t>(id)];
    if (memo) return *memo;
    const Node& n = node(id);
    Alternative out;
    switch (n.kind) {
      case Node::Kind::kEmpty: break;
      case Node::Kind::kChars: out = chars(n.chars); break;
      case Node::Kind::kSeq:
        for (int32_t c : n.children) {
          const Alternative part = emit(c);
          out.insert(out.end(), part.begin(), part.end());
        }
        break;
      case Node::Kind::kAlt: {
        std::vector<Alternative> alts;
        for (int32_t c : n.children) alts.push_back(emit(c));
        out = {rule_of(alts, "group")};
        break;
      }
      case Node::Kind::kRepeat: out = emit_repeat(n); break;
    }
    memo = out;
    return out;
  }

  // x{m,n}. A star over an item that can match nothing would be a left-recursive rule
  // (star ::= item star), so such an item is replaced by its non-empty part: for a nullable x,
  // x{m,n} is the same language as (x minus the empty string){0,n}.
  Alternative emit_repeat(const Node& n) {
    if (n.max == 0) return {};
    const Node& x = node(n.children[0]);
    if (!x.nullable) return repeat(item({emit(n.children[0])}), n.min, n.max, n);
    const std::vector<Alternative> alts = nonempty(n.children[0]);
    if (alts.empty()) return {};
    return repeat(item(alts), 0, n.max, n);
  }

  // The alternatives matching the non-empty texts node `id` matches (none: it matches only "").
  std::vector<Alternative> nonempty(int32_t id) {
    if (error_) return {};
    std::optional<std::vector<Alternative>>& memo = nonempty_[static_cast<size_t>(id)];
    if (memo) return *memo;
    const Node& n = node(id);
    std::vector<Alternative> out;
    if (!n.nullable) {
      out.push_back(emit(id));
    } else if (n.kind == Node::Kind::kAlt) {
      for (int32_t c : n.children) {
        for (Alternative& a : nonempty(c)) out.push_back(std::move(a));
      }
    } else if (n.kind == Node::Kind::kSeq) {
      out = nonempty_seq(n);
    } else if (n.kind == Node::Kind::kRepeat && n.max != 0) {
      // x{0,n} with x non-empty: x{1,n}; for a nullable x, (x minus "") {1,n}.
      const int32_t x = n.children[0];
      const std::vector<Alternative> alts = node(x).nullable ? nonempty(x) : std::vector<Alternative>{emit(x)};
      if (!alts.empty()) out.push_back(repeat(item(alts), 1, n.max, n));
    }
    memo = out;
    return out;
  }

  // c1 c2 ... ck, every ci nullable: a non-empty text has a first non-empty part ci, so it is
  // (ci minus "") c(i+1) ... ck for some i.
  std::vector<Alternative> nonempty_seq(const Node& n) {
    std::vector<Alternative> out;
    Alternative suffix;  // c(i+1) ... ck
    for (size_t i = n.children.size(); i-- > 0;) {
      for (const Alternative& first : nonempty(n.children[i])) {
        if (!charge(static_cast<int64_t>(first.size() + suffix.size()), 0, n)) return {};
        Alternative a = first;
        a.insert(a.end(), suffix.begin(), suffix.end());
        out.push_back(std::move(a));
      }
      if (i > 0) {
        const Alternative part = emit(n.children[i]);
        suffix.insert(suffix.begin(), part.begin(), part.end());
      }
    }
    std::reverse(out.begin(), out.end());  // in the pattern's order (cosmetic)
    return out;
  }

  // What a repetition copies: one short sequence, else one element.
  Alternative item(const std::vector<Alternative>& alts) {
    if (alts.size() == 1 && alts[0].size() <= kMaxCopiedItems) return alts[0];
    return {rule_of(alts, "group")};
  }

  Alternative repeat(const Alternative& item, int64_t min, int64_t max, const Node& n) {
    if (min == 1 && max == 1) return item;
    const int64_t copies = max < 0 ? min + 1 : max;
    const int64_t rules = max < 0 ? 2 : max - min + 1;
    if (!charge(static_cast<int64_t>(item.size()) * copies + rules, rules, n)) return {};
    return {b_.repeat(item, min, max, hint_ + "-repeat")};
  }

  // One character of `ranges`. For json_string, the characters JSON escapes (at most 34) are
  // their escape sequences, an alternative beside the class of the others.
  Alternative chars(const Ranges& ranges) {
    auto cached = chars_.find(ranges);
    if (cached != chars_.end()) return cached->second;
    Ranges plain;
    std::vector<uint32_t> escaped;
    for (auto [lo, hi] : ranges) {
      for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x5C); ++c) {
        if (options_.json_string && json_escaped(c)) escaped.push_back(c);
      }
    }
    if (!options_.json_string) {
      plain = ranges;
    } else {
      for (auto [lo, hi] : ranges) {
        for (auto [a, z] : Ranges{{0x20, 0x21}, {0x23, 0x5B}, {0x5D, kMaxCodePoint}}) {
          if (std::max(lo, a) <= std::min(hi, z)) plain.emplace_back(std::max(lo, a), std::min(hi, z));
        }
      }
    }
    Alternative out;
    if (escaped.empty() && plain.size() == 1 && plain[0].first == plain[0].second) {
      out = b_.literal(utf8_encode(plain[0].first));
    } else if (plain.empty() && escaped.size() == 1) {
      out = b_.literal(json_form(escaped[0]));
    } else {
      Alternative escapes;
      if (!escaped.empty()) {
        escapes = {b_.byte('\\')};
        const Alternative tail = escape_tail(escaped);
        escapes.insert(escapes.end(), tail.begin(), tail.end());
      }
      if (plain.empty()) {
        out = escapes;
      } else {
        const Element e = b_.code_points(plain, hint_ + "-class");
        if (!escapes.empty()) b_.add_alternative(e.index, escapes);
        ++rules_;
        out = {e};
      }
    }
    chars_.emplace(ranges, out);
    return out;
  }

  // What follows the '\' of the escape sequences of `escaped`, as a small trie:
  // one byte set for the short escapes (\" \\ \b \f \n \r \t), and \u00 then [01] then a hex
  // digit for the others, rather than one alternative per character, all starting with '\'.
  Alternative escape_tail(const std::vector<uint32_t>& escaped) {
    auto cached = escape_tails_.find(escaped);
    if (cached != escape_tails_.end()) return cached->second;
    ByteSet short_forms;
    std::array<ByteSet, 2> hex_digit;  // by the first digit after \u00
    for (uint32_t c : escaped) {
      const std::string form = json_form(c);
      if (form.size() == 2) {
        short_forms.add(static_cast<uint8_t>(form[1]));
      } else {
        hex_digit[static_cast<size_t>(form[4] - '0')].add(static_cast<uint8_t>(form[5]));
      }
    }
    std::vector<Alternative> alts;
    if (!short_forms.empty()) alts.push_back({b_.bytes(short_forms)});
    std::vector<Alternative> hex;
    for (int d = 0; d < 2; ++d) {
      if (!hex_digit[static_cast<size_t>(d)].empty()) {
        hex.push_back({b_.byte(static_cast<uint8_t>('0' + d)), b_.bytes(hex_digit[static_cast<size_t>(d)])});
      }
    }
    if (!hex.empty()) {
      Alternative u = b_.literal("u00");
      const Alternative rest = hex.size() == 1 ? hex[0] : Alternative{rule_of(hex, "escape")};
      u.insert(u.end(), rest.begin(), rest.end());
      alts.push_back(std::move(u));
    }
    const Alternative out = alts.size() == 1 ? alts[0] : Alternative{rule_of(alts, "escape")};
    escape_tails_.emplace(escaped, out);
    return out;
  }

  GrammarBuilder& b_;
  const Ast& ast_;
  std::string_view p_;
  const RegexOptions& options_;
  const std::string& hint_;
  std::vector<std::optional<Alternative>> emitted_;
  std::vector<std::optional<std::vector<Alternative>>> nonempty_;
  std::map<Ranges, Alternative> chars_;  // a class used again is the same rule
  std::map<std::vector<uint32_t>, Alternative> escape_tails_;  // and so are its escapes
  std::optional<Element> any_text_;
  int64_t items_ = 0, rules_ = 0;
  std::optional<std::string> error_;
};

}  // namespace

Result<Element> add_regex(GrammarBuilder& b, std::string_view pattern, const RegexOptions& options,
                          const std::string& hint) {
  Result<Ast> ast = RegexParser(pattern, options.json_string).parse();
  if (!ast.ok()) return ast.status();
  return RegexEmitter(b, *ast, pattern, options, hint).emit_root();
}

Result<Grammar> regex_grammar(std::string_view pattern) {
  GrammarBuilder b;
  Result<Element> root = add_regex(b, pattern, RegexOptions{}, "regex");
  if (!root.ok()) return root.status();
  Result<Grammar> g = std::move(b).build(root->index);
  if (!g.ok()) return invalid_argument("regex: " + g.status().message());
  return g;
}

}  // namespace pagoda::structured
