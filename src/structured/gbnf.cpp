#include "structured/gbnf.h"

#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/unicode.h"

namespace pagoda::structured {
namespace {

constexpr int kMaxNesting = 200;  // parentheses within parentheses (the parser recurses on them)

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

class GbnfParser {
 public:
  explicit GbnfParser(std::string_view text) : text_(text) {}

  Result<Grammar> parse() {
    skip_space(/*newlines=*/true);
    while (!error_ && pos_ < text_.size()) {
      parse_rule();
      skip_space(true);
    }
    if (error_) return invalid_argument(*error_);
    const auto root = defined_.find("root");
    if (root == defined_.end()) return invalid_argument("GBNF: the grammar has no rule 'root'");
    Result<Grammar> g = std::move(b_).build(root->second);
    if (!g.ok()) return invalid_argument("GBNF: " + g.status().message());
    return g;
  }

 private:
  void fail(const std::string& what) {
    if (error_) return;
    size_t line = 1, col = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    error_ = "GBNF: line " + std::to_string(line) + ", column " + std::to_string(col) + ": " + what;
  }

  bool eof() const { return pos_ >= text_.size(); }
  char peek() const { return eof() ? '\0' : text_[pos_]; }

  // Spaces, tabs and comments; newlines too when `newlines`.
  void skip_space(bool newlines) {
    while (!eof()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (!eof() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  // At a line break, whether the next line that is not blank continues the rule ('|' first).
  bool continues_on_next_line() {
    size_t save = pos_;
    skip_space(true);
    if (peek() == '|') return true;
    pos_ = save;
    return false;
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!eof() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  void parse_rule() {
    const size_t name_pos = pos_;
    const std::string name = parse_name();
    if (name.empty()) return fail("expected a rule name");
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=") return fail("expected '::=' after '" + name + "'");
    pos_ += 3;
    skip_space(true);
    const int32_t r = b_.rule(name);
    if (!defined_.emplace(name, r).second) {
      pos_ = name_pos;
      return fail("rule '" + name + "' is defined twice");
    }
    parse_alternates(r, /*nested=*/0);
    skip_space(false);
    if (!error_ && !eof() && peek() != '\n') fail(std::string("unexpected '") + peek() + "'");
  }

  void parse_alternates(int32_t rule, int nested) {
    while (!error_) {
      b_.add_alternative(rule, parse_sequence(nested));
      skip_space(nested > 0);
      if (peek() == '\n' && nested == 0) continues_on_next_line();  // moves to a '|' that opens the next line
      if (peek() != '|') return;
      ++pos_;
      skip_space(true);
    }
  }

  Alternative parse_sequence(int nested) {
    Alternative seq;
    while (!error_) {
      skip_space(nested > 0);
      const size_t item_start = seq.size();
      const char c = peek();
      if (c == '"') {
        ++pos_;
        while (!error_ && peek() != '"') {
          if (eof() || peek() == '\n') return fail("unterminated literal"), seq;
          const std::optional<uint32_t> cp = parse_char();
          if (!cp) return seq;
          Alternative bytes = b_.literal(utf8_encode(*cp));
          seq.insert(seq.end(), bytes.begin(), bytes.end());
        }
        ++pos_;
        if (seq.size() == item_start) {  // "" matches the empty string: nothing to repeat
          if (is_postfix(peek())) return fail("a repetition of the empty literal"), seq;
          continue;
        }
      } else if (c == '[') {
        ++pos_;
        seq.push_back(parse_class());
      } else if (c == '.') {
        ++pos_;
        seq.push_back(b_.code_points({{0, 0x10FFFF}}, "any-char"));
      } else if (c == '(') {
        if (nested >= kMaxNesting) return fail("parentheses nested deeper than " + std::to_string(kMaxNesting)), seq;
        ++pos_;
        skip_space(true);
        const int32_t group = b_.fresh_rule("group");
        parse_alternates(group, nested + 1);
        skip_space(true);
        if (peek() != ')') return fail("expected ')'"), seq;
        ++pos_;
        seq.push_back(GrammarBuilder::ref(group));
      } else if (is_name_char(c)) {
        const size_t save = pos_;
        const std::string name = parse_name();
        // `name ::=` starts the next rule (a rule's last line needs no terminator).
        size_t look = pos_;
        while (look < text_.size() && (text_[look] == ' ' || text_[look] == '\t')) ++look;
        if (nested == 0 && text_.substr(look, 3) == "::=") {
          pos_ = save;
          return seq;
        }
        seq.push_back(GrammarBuilder::ref(b_.rule(name)));
      } else {
        return seq;
      }
      if (error_) return seq;
      parse_postfix(seq, item_start);
    }
    return seq;
  }

  static bool is_postfix(char c) { return c == '*' || c == '+' || c == '?' || c == '{'; }

  // A repetition after the item seq[item_start..] replaces it with a repeat rule.
  void parse_postfix(Alternative& seq, size_t item_start) {
    while (!error_ && is_postfix(peek())) {
      int64_t min = 0, max = -1;
      const char c = peek();
      ++pos_;
      if (c == '+') {
        min = 1;
      } else if (c == '?') {
        max = 1;
      } else if (c == '{') {
        skip_space(false);
        const std::optional<int64_t> lo = parse_int();
        skip_space(false);
        if (peek() == '}') {
          if (!lo) return fail("expected a number in {}");
          min = max = *lo;
        } else if (peek() == ',') {
          ++pos_;
          skip_space(false);
          min = lo.value_or(0);
          const std::optional<int64_t> hi = parse_int();
          max = hi.value_or(-1);
          skip_space(false);
          if (peek() != '}') return fail("expected '}'");
          if (hi && *hi < min) return fail("{" + std::to_string(min) + "," + std::to_string(*hi) + "} has max < min");
        } else {
          return fail("expected '}' or ','");
        }
        ++pos_;
      }
      const Alternative item(seq.begin() + static_cast<std::ptrdiff_t>(item_start), seq.end());
      seq.resize(item_start);
      seq.push_back(b_.repeat(item, min, max, "repeat"));
    }
  }

  std::optional<int64_t> parse_int() {
    const size_t start = pos_;
    int64_t v = 0;
    while (!eof() && peek() >= '0' && peek() <= '9') {
      if (v > GrammarBuilder::kMaxRepeat) return fail("a repetition count over " + std::to_string(GrammarBuilder::kMaxRepeat)), std::nullopt;
      v = v * 10 + (peek() - '0');
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    return v;
  }

  Element parse_class() {
    std::vector<std::pair<uint32_t, uint32_t>> ranges;
    const bool negated = peek() == '^';
    if (negated) ++pos_;
    while (!error_ && peek() != ']') {
      if (eof()) return fail("unterminated character class"), Element{};
      const std::optional<uint32_t> lo = parse_char();
      if (!lo) return Element{};
      uint32_t hi = *lo;
      if (peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        const std::optional<uint32_t> end = parse_char();
        if (!end) return Element{};
        if (*end < *lo) return fail("a class range ends before it starts"), Element{};
        hi = *end;
      }
      ranges.emplace_back(*lo, hi);
    }
    ++pos_;
    if (negated) ranges = complement_code_points(std::move(ranges));
    if (ranges.empty()) return fail("a character class that matches nothing"), Element{};
    return b_.code_points(ranges, "class");
  }

  // One character of a literal or class: an escape, or a UTF-8 character of the grammar's text.
  std::optional<uint32_t> parse_char() {
    const auto c = static_cast<unsigned char>(peek());
    if (c == '\\') {
      ++pos_;
      const char e = peek();
      ++pos_;
      switch (e) {
        case 'n': return '\n';
        case 't': return '\t';
        case 'r': return '\r';
        case '\\': case '"': case '[': case ']': case '-': case '/': case '\'': case '^': return static_cast<uint32_t>(e);
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        default: return fail(std::string("unknown escape '\\") + e + "'"), std::nullopt;
      }
    }
    const unicode::Utf8Step step = unicode::decode_utf8(text_, pos_);
    if (!step.valid) return fail("the grammar is not UTF-8"), std::nullopt;
    pos_ += step.length;
    return static_cast<uint32_t>(step.code_point);
  }

  std::optional<uint32_t> parse_hex(int digits) {
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = peek();
      int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
      if (d < 0) return fail("expected " + std::to_string(digits) + " hex digits"), std::nullopt;
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return fail("not a Unicode scalar value"), std::nullopt;
    return v;
  }

  std::string_view text_;
  size_t pos_ = 0;
  GrammarBuilder b_;
  std::unordered_map<std::string, int32_t> defined_;
  std::optional<std::string> error_;
};

}  // namespace

Result<Grammar> parse_gbnf(std::string_view text) { return GbnfParser(text).parse(); }

}  // namespace pagoda::structured
