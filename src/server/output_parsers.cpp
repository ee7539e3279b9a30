// Reasoning and tool-call parsers as resumable scanners: each keeps the text it was given and a
// position, decides a byte only once the bytes after it that the decision needs have come, and
// never goes back over decided text (held text is looked at again at most once, when the answer
// takes it back). parse_output() is a stream fed everything at once, so whole and streamed
// parsing cannot disagree.
#include "server/output_parsers.h"

#include <charconv>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "tokenizer/unicode.h"

namespace pagoda::server {
namespace {

using json = nlohmann::json;

constexpr size_t kMaxJsonDepth = 512;  // deeper call JSON is not a call
constexpr int kMaxPyDepth = 200;       // deeper Python literals are not a call
constexpr size_t kMaxMistralName = 256;

bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_hex(char c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool is_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
// Python identifiers (non-ASCII letters are taken on trust).
bool is_ident_start(char c) { return is_alpha(c) || c == '_' || static_cast<unsigned char>(c) >= 0x80; }
bool is_ident(char c) { return is_ident_start(c) || is_digit(c); }
// Mistral's function names and call ids.
bool is_name_char(char c) { return is_ident(c) || c == '-' || c == '.'; }

// The length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t partial_tag(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

enum class Match { kYes, kNo, kMaybe };

// Whether `t` has `tag` at `pos`; kMaybe when the text so far is a proper prefix of it and more may
// come.
Match match_at(std::string_view t, size_t pos, std::string_view tag, bool end) {
  const size_t n = std::min(t.size() - pos, tag.size());
  if (t.substr(pos, n) != tag.substr(0, n)) return Match::kNo;
  if (n < tag.size()) return end ? Match::kNo : Match::kMaybe;
  return Match::kYes;
}

std::string quote_json(const std::string& s) {
  return json(s).dump(-1, ' ', false, json::error_handler_t::replace);
}


// ---- a JSON value, checked one byte at a time (RFC 8259, nesting bounded) ----

class JsonScanner {
 public:
  enum Feed : uint8_t {
    kTake,        // the byte is part of the value, which goes on
    kDone,        // the byte is the value's last
    kDoneBefore,  // the value (a number) ended before the byte, which is not part of it
    kBad,         // the byte cannot come here
  };

  void reset() {
    st_ = S::kValue;
    stack_.clear();
  }

  Feed feed(char c) {
    switch (st_) {
      case S::kArrFirst:
        if (c == ']') {
          stack_.pop_back();
          return ended();
        }
        [[fallthrough]];
      case S::kValue:
        if (is_ws(c)) return kTake;
        switch (c) {
          case '{':
          case '[':
            if (stack_.size() >= kMaxJsonDepth) return kBad;
            stack_.push_back(c);
            st_ = c == '{' ? S::kObjFirst : S::kArrFirst;
            return kTake;
          case '"':
            key_ = false;
            st_ = S::kString;
            return kTake;
          case '-':
            st_ = S::kNumMinus;
            return kTake;
          case '0':
            st_ = S::kNumZero;
            return kTake;
          case 't':
            literal_ = "rue";
            st_ = S::kLiteral;
            return kTake;
          case 'f':
            literal_ = "alse";
            st_ = S::kLiteral;
            return kTake;
          case 'n':
            literal_ = "ull";
            st_ = S::kLiteral;
            return kTake;
          default:
            if (c >= '1' && c <= '9') {
              st_ = S::kNumInt;
              return kTake;
            }
            return kBad;
        }
      case S::kObjFirst:
      case S::kObjKey:
        if (is_ws(c)) return kTake;
        if (c == '}' && st_ == S::kObjFirst) {
          stack_.pop_back();
          return ended();
        }
        if (c != '"') return kBad;
        key_ = true;
        st_ = S::kString;
        return kTake;
      case S::kColon:
        if (is_ws(c)) return kTake;
        if (c != ':') return kBad;
        st_ = S::kValue;
        return kTake;
      case S::kAfterMember:
      case S::kAfterElem: {
        if (is_ws(c)) return kTake;
        const bool member = st_ == S::kAfterMember;
        if (c == ',') {
          st_ = member ? S::kObjKey : S::kValue;
          return kTake;
        }
        if (c != (member ? '}' : ']')) return kBad;
        stack_.pop_back();
        return ended();
      }
      case S::kString:
        if (c == '"') {
          if (!key_) return ended();
          key_ = false;
          st_ = S::kColon;
          return kTake;
        }
        if (c == '\\') {
          st_ = S::kEscape;
          return kTake;
        }
        return static_cast<unsigned char>(c) < 0x20 ? kBad : kTake;
      case S::kEscape:
        switch (c) {
          case '"': case '\\': case '/': case 'b': case 'f': case 'n': case 'r': case 't':
            st_ = S::kString;
            return kTake;
          case 'u':
            hex_left_ = 4;
            st_ = S::kHex;
            return kTake;
          default:
            return kBad;
        }
      case S::kHex:
        if (!is_hex(c)) return kBad;
        if (--hex_left_ == 0) st_ = S::kString;
        return kTake;
      case S::kLiteral:
        if (c != *literal_) return kBad;
        return *++literal_ == '\0' ? ended() : kTake;
      case S::kNumMinus:
        if (c == '0') {
          st_ = S::kNumZero;
          return kTake;
        }
        if (c >= '1' && c <= '9') {
          st_ = S::kNumInt;
          return kTake;
        }
        return kBad;
      case S::kNumZero:
      case S::kNumInt:
        if (st_ == S::kNumInt && is_digit(c)) return kTake;
        if (c == '.') {
          st_ = S::kNumDot;
          return kTake;
        }
        if (c == 'e' || c == 'E') {
          st_ = S::kNumE;
          return kTake;
        }
        return number_ended(c);
      case S::kNumDot:
        if (!is_digit(c)) return kBad;
        st_ = S::kNumFrac;
        return kTake;
      case S::kNumFrac:
        if (is_digit(c)) return kTake;
        if (c == 'e' || c == 'E') {
          st_ = S::kNumE;
          return kTake;
        }
        return number_ended(c);
      case S::kNumE:
        if (c == '+' || c == '-') {
          st_ = S::kNumESign;
          return kTake;
        }
        [[fallthrough]];
      case S::kNumESign:
        if (!is_digit(c)) return kBad;
        st_ = S::kNumExp;
        return kTake;
      case S::kNumExp:
        if (is_digit(c)) return kTake;
        return number_ended(c);
    }
    return kBad;
  }

 private:
  enum class S : uint8_t {
    kValue, kArrFirst, kObjFirst, kObjKey, kColon, kAfterMember, kAfterElem, kString, kEscape,
    kHex, kLiteral, kNumMinus, kNumZero, kNumInt, kNumDot, kNumFrac, kNumE, kNumESign, kNumExp,
  };

  // A value just ended (its last byte taken).
  Feed ended() {
    if (stack_.empty()) return kDone;
    st_ = stack_.back() == '{' ? S::kAfterMember : S::kAfterElem;
    return kTake;
  }
  // A number ended before `c`: at the top that is the value's end, inside a container `c` goes on.
  Feed number_ended(char c) {
    if (stack_.empty()) return kDoneBefore;
    ended();
    return feed(c);
  }

  S st_ = S::kValue;
  bool key_ = false;
  int hex_left_ = 0;
  const char* literal_ = "";
  std::vector<char> stack_;  // '{' and '[' open around the current byte
};

// Whether `s` (whitespace around it allowed) is one JSON object; `object` is it, trimmed.
bool json_object_text(std::string_view s, std::string_view& object) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos || s[b] != '{') return false;
  const size_t e = s.find_last_not_of(" \t\r\n") + 1;
  JsonScanner scanner;
  for (size_t i = b; i < e; ++i) {
    const JsonScanner::Feed f = scanner.feed(s[i]);
    if (f == JsonScanner::kDone) {
      if (i + 1 != e) return false;
      object = s.substr(b, e - b);
      return true;
    }
    if (f != JsonScanner::kTake) return false;
  }
  return false;
}

// ---- Python call lists: [f(a=1), g()] to names and JSON arguments ----

class PythonCalls {
 public:
  explicit PythonCalls(std::string_view s) : s_(s) {}

  // The calls of a whole list text ("[" ... "]"), or false.
  bool parse(std::vector<ParsedToolCall>& calls) {
    if (!eat('[') || eat(']')) return false;  // an empty list calls nothing: it is text
    for (;;) {
      ParsedToolCall call;
      skip_ws();
      if (!ident(call.name) || !eat('(')) return false;
      std::vector<std::pair<std::string, std::string>> kwargs;
      std::unordered_set<std::string> seen;
      if (!eat(')')) {
        for (;;) {
          std::string key;
          skip_ws();
          if (!ident(key) || !eat('=')) return false;
          Value v;
          if (!value(v, 0)) return false;
          if (!seen.insert(key).second) return false;  // a repeated keyword: Python refuses it
          kwargs.emplace_back(std::move(key), std::move(v.json));
          if (eat(',')) {
            if (eat(')')) break;
            continue;
          }
          if (eat(')')) break;
          return false;
        }
      }
      call.arguments = object_json(kwargs);
      calls.push_back(std::move(call));
      if (eat(',')) {
        if (eat(']')) break;
        continue;
      }
      if (eat(']')) break;
      return false;
    }
    return i_ == s_.size();
  }

 private:
  enum class Kind { kString, kNumber, kBool, kNone, kOther };
  struct Value {
    Kind kind = Kind::kOther;
    std::string json;  // the value as JSON
    std::string text;  // a string's text
  };

  static std::string object_json(const std::vector<std::pair<std::string, std::string>>& members) {
    std::string out = "{";
    for (size_t i = 0; i < members.size(); ++i) {
      if (i > 0) out += ", ";
      out += quote_json(members[i].first);
      out += ": ";
      out += members[i].second;
    }
    out += '}';
    return out;
  }

  bool at_end() const { return i_ >= s_.size(); }
  char peek(size_t ahead = 0) const { return i_ + ahead < s_.size() ? s_[i_ + ahead] : '\0'; }

  // Inside brackets Python allows any whitespace and backslash line continuations.
  void skip_ws() {
    while (!at_end()) {
      if (is_ws(s_[i_]) || s_[i_] == '\f') {
        ++i_;
      } else if (s_[i_] == '\\' && peek(1) == '\n') {
        i_ += 2;
      } else {
        break;
      }
    }
  }
  bool eat(char c) {
    skip_ws();
    if (peek() != c || at_end()) return false;
    ++i_;
    return true;
  }
  bool ident(std::string& out) {
    if (at_end() || !is_ident_start(s_[i_])) return false;
    const size_t b = i_;
    while (!at_end() && is_ident(s_[i_])) ++i_;
    out.assign(s_.substr(b, i_ - b));
    return true;
  }

  // Whether a string literal (with its prefix) starts here.
  bool string_starts() const {
    size_t j = i_;
    for (int n = 0; n < 2 && j < s_.size() && is_alpha(s_[j]); ++n) ++j;
    return j < s_.size() && (s_[j] == '"' || s_[j] == '\'');
  }

  bool value(Value& v, int depth) {
    if (depth > kMaxPyDepth) return false;
    skip_ws();
    if (at_end()) return false;
    const char c = s_[i_];
    if (c == '[' || c == '(') {
      ++i_;
      std::vector<Value> items;
      bool comma = false;
      if (!sequence(c == '[' ? ']' : ')', items, comma, depth)) return false;
      if (c == '(' && items.size() == 1 && !comma) {  // (x) is x; (x,) a tuple
        v = std::move(items[0]);
        return true;
      }
      v.kind = Kind::kOther;
      v.json = "[";
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) v.json += ", ";
        v.json += items[k].json;
      }
      v.json += ']';
      return true;
    }
    if (c == '{') {
      ++i_;
      return dict(v, depth);
    }
    if (string_starts()) {
      v.kind = Kind::kString;
      v.text.clear();
      do {  // adjacent literals are one string
        if (!string(v.text)) return false;
        skip_ws();
      } while (string_starts());
      v.json = quote_json(v.text);
      return true;
    }
    if (c == '-' || c == '+') {
      ++i_;
      skip_ws();
      if (!number(v, c == '-')) return false;
      return true;
    }
    if (is_digit(c) || (c == '.' && is_digit(peek(1)))) return number(v, false);
    std::string word;
    if (!ident(word)) return false;
    if (word == "True" || word == "False") {
      v.kind = Kind::kBool;
      v.json = word == "True" ? "true" : "false";
      return true;
    }
    if (word == "None") {
      v.kind = Kind::kNone;
      v.json = "null";
      return true;
    }
    return false;  // a name, a call, anything not a literal
  }

  bool sequence(char close, std::vector<Value>& items, bool& comma, int depth) {
    if (eat(close)) return true;
    for (;;) {
      Value v;
      if (!value(v, depth + 1)) return false;
      items.push_back(std::move(v));
      if (eat(',')) {
        comma = true;
        if (eat(close)) return true;
        continue;
      }
      return eat(close);
    }
  }

  // After "{": a dict (a set is not JSON). Keys become strings as json.dumps makes them; a repeated
  // key keeps its first place and its last value, as a Python dict does.
  bool dict(Value& v, int depth) {
    std::vector<std::pair<std::string, std::string>> members;
    std::unordered_map<std::string, size_t> where;
    if (!eat('}')) {
      for (;;) {
        Value key;
        Value val;
        if (!value(key, depth + 1) || !eat(':') || !value(val, depth + 1)) return false;
        std::string name;
        switch (key.kind) {
          case Kind::kString: name = std::move(key.text); break;
          case Kind::kNumber:
          case Kind::kBool:
          case Kind::kNone: name = key.json; break;
          case Kind::kOther: return false;
        }
        const auto [it, fresh] = where.emplace(name, members.size());
        if (fresh) {
          members.emplace_back(std::move(name), std::move(val.json));
        } else {
          members[it->second].second = std::move(val.json);
        }
        if (eat(',')) {
          if (eat('}')) break;
          continue;
        }
        if (eat('}')) break;
        return false;
      }
    }
    v.kind = Kind::kOther;
    v.json = object_json(members);
    return true;
  }

  // A number after its sign: ints as their decimal digits (any size), floats as json.dumps writes
  // them (shortest round trip).
  bool number(Value& v, bool negative) {
    v.kind = Kind::kNumber;
    if (peek() == '0' && (peek(1) == 'x' || peek(1) == 'X' || peek(1) == 'o' || peek(1) == 'O' ||
                          peek(1) == 'b' || peek(1) == 'B')) {
      const char base_char = static_cast<char>(peek(1) | 0x20);
      const int base = base_char == 'x' ? 16 : base_char == 'o' ? 8 : 2;
      i_ += 2;
      uint64_t n = 0;
      bool any = false;
      while (!at_end() && (is_hex(s_[i_]) || s_[i_] == '_')) {
        const char d = s_[i_];
        if (d != '_') {
          const int digit = is_digit(d) ? d - '0' : (d | 0x20) - 'a' + 10;
          if (digit >= base || n > (UINT64_MAX - digit) / base) return false;
          n = n * base + digit;
          any = true;
        }
        ++i_;
      }
      if (!any || (!at_end() && is_ident(s_[i_]))) return false;
      v.json = (negative && n != 0 ? "-" : "") + std::to_string(n);
      return true;
    }
    std::string digits;
    bool is_float = false;
    auto take_digits = [&] {
      while (!at_end() && (is_digit(s_[i_]) || s_[i_] == '_')) {
        if (s_[i_] != '_') digits += s_[i_];
        ++i_;
      }
    };
    take_digits();
    if (peek() == '.') {
      is_float = true;
      digits += '.';
      ++i_;
      take_digits();
    }
    if ((peek() == 'e' || peek() == 'E') &&
        (is_digit(peek(1)) || ((peek(1) == '+' || peek(1) == '-') && is_digit(peek(2))))) {
      is_float = true;
      digits += 'e';
      ++i_;
      if (peek() == '+' || peek() == '-') digits += s_[i_++];
      take_digits();
    }
    if (digits.empty() || digits == "." || (!at_end() && is_ident(s_[i_]))) return false;  // 1j, 1abc
    if (!is_float) {
      const size_t nz = digits.find_first_not_of('0');
      if (nz == std::string::npos) {
        v.json = "0";
        return true;
      }
      if (nz > 0) return false;  // 012 is not Python 3
      v.json = (negative ? "-" : "") + digits;
      return true;
    }
    double d = 0;
    const auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), d);
    if (ec != std::errc() || ptr != digits.data() + digits.size()) return false;  // inf is not JSON
    v.json = json(negative ? -d : d).dump();
    return true;
  }

  // A string literal with its prefix (r, u); bytes and f-strings are not literals we take.
  bool string(std::string& out) {
    bool raw = false;
    while (!at_end() && is_alpha(s_[i_])) {
      const char p = static_cast<char>(s_[i_] | 0x20);
      if (p == 'r') {
        raw = true;
      } else if (p != 'u') {
        return false;
      }
      ++i_;
    }
    const char q = peek();
    const bool triple = peek(1) == q && peek(2) == q;
    i_ += triple ? 3 : 1;
    for (;;) {
      if (at_end()) return false;
      const char c = s_[i_];
      if (c == q) {
        if (!triple) {
          ++i_;
          return true;
        }
        if (peek(1) == q && peek(2) == q) {
          i_ += 3;
          return true;
        }
      }
      if (c == '\n' && !triple) return false;
      if (c != '\\') {
        out += c;
        ++i_;
        continue;
      }
      if (i_ + 1 >= s_.size()) return false;
      const char e = s_[i_ + 1];
      i_ += 2;
      if (raw) {  // a raw string keeps its backslashes (they still keep a quote from ending it)
        out += '\\';
        out += e;
        continue;
      }
      switch (e) {
        case '\n': break;  // a line continuation
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x':
        case 'u':
        case 'U': {
          const int len = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int k = 0; k < len; ++k) {
            const char h = peek();
            if (!is_hex(h)) return false;
            cp = cp * 16 + (is_digit(h) ? h - '0' : (h | 0x20) - 'a' + 10);
            ++i_;
          }
          if (cp > 0x10FFFF) return false;
          unicode::append_utf8(static_cast<char32_t>(cp), out);
          break;
        }
        case 'N': return false;  // \N{name}: not worth a table of Unicode names
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = e - '0';
            for (int k = 0; k < 2 && peek() >= '0' && peek() <= '7'; ++k) cp = cp * 8 + (s_[i_++] - '0');
            unicode::append_utf8(static_cast<char32_t>(cp), out);
          } else {  // Python keeps an unknown escape as written
            out += '\\';
            out += e;
          }
      }
    }
  }

  std::string_view s_;
  size_t i_ = 0;
};

// ---- reasoning ----

class ThinkSplitter final : public ReasoningParser::Splitter {
 public:
  // starts_inside: the output opens inside the thinking (deepseek_r1); else it must open with
  // "<think>" (qwen3).
  explicit ThinkSplitter(bool starts_inside) : starts_inside_(starts_inside), found_(starts_inside) {}

  void push(std::string_view piece, bool end, std::string& reasoning, std::string& rest) override {
    buf_.append(piece);
    for (;;) {
      switch (st_) {
        case St::kStart: {
          if (!starts_inside_) {
            while (skipped_ < buf_.size() && is_ws(buf_[skipped_])) ++skipped_;
          }
          const Match m = match_at(buf_, skipped_, kOpen, end);
          if (m == Match::kMaybe) return;
          if (m == Match::kYes) {
            buf_.erase(0, skipped_ + kOpen.size());
            found_ = true;
            st_ = St::kThink;
          } else {
            st_ = starts_inside_ ? St::kThink : St::kRest;
          }
          break;
        }
        case St::kThink: {
          const size_t at = buf_.find(kClose);
          if (at == std::string::npos) {
            const size_t keep = end ? 0 : partial_tag(buf_, kClose);
            reasoning.append(buf_, 0, buf_.size() - keep);
            buf_.erase(0, buf_.size() - keep);
            return;
          }
          reasoning.append(buf_, 0, at);
          buf_.erase(0, at + kClose.size());
          st_ = St::kLineBreaks;
          break;
        }
        case St::kLineBreaks: {
          const size_t n = std::min(buf_.find_first_not_of("\r\n"), buf_.size());
          buf_.erase(0, n);
          if (buf_.empty()) return;
          st_ = St::kRest;
          break;
        }
        case St::kRest:
          rest.append(buf_);
          buf_.clear();
          return;
      }
    }
  }

  bool found() const override { return found_; }

 private:
  static constexpr std::string_view kOpen = "<think>";
  static constexpr std::string_view kClose = "</think>";
  enum class St { kStart, kThink, kLineBreaks, kRest };

  const bool starts_inside_;
  bool found_;
  St st_ = St::kStart;
  std::string buf_;     // undecided text (a partial tag; at the start, whitespace before "<think>")
  size_t skipped_ = 0;  // the whitespace at buf_'s start already looked at
};

class ThinkParser final : public ReasoningParser {
 public:
  explicit ThinkParser(bool starts_inside) : starts_inside_(starts_inside) {}
  std::unique_ptr<Splitter> start() const override { return std::make_unique<ThinkSplitter>(starts_inside_); }
  std::string end_tag() const override { return "</think>"; }

 private:
  bool starts_inside_;
};

// ---- tool calls ----

enum class Format { kHermes, kLlama3Json, kMistral, kPythonic };

class ToolScanner final : public ToolParser::Scanner {
 public:
  explicit ToolScanner(Format format) : format_(format) {
    state_ = format == Format::kLlama3Json ? St::kLlamaStart
             : format == Format::kPythonic ? St::kPyStart
                                           : St::kContent;
  }

  void push(std::string_view piece, bool end, OutputDelta& out) override {
    if (done_) return;
    t_.append(piece);
    end_ = end;
    out_ = &out;
    while (step()) {
    }
    flush_args();
    if (end) {
      if (!after_call_) out.content += held_ws_;
      held_ws_.clear();
      done_ = true;
    }
    out_ = nullptr;
  }

 private:
  enum class St {
    kContent,      // the answer's text, looking for a call's marker
    kPlain,        // the answer's text, no call can start any more
    kHermesOpen,   // after <tool_call>: whitespace, then the object
    kHermesClose,  // after a hermes call's object: whitespace, then </tool_call>
    kLlamaStart,   // the output's start: whitespace, <|python_tag|>, whitespace, then "{"
    kLlamaAfter,   // after a call: whitespace, then ";"
    kLlamaNext,    // after ";": whitespace, then "{"
    kMistralStart,      // after [TOOL_CALLS]: whitespace, then "[", "{" or a name
    kMistralArrayFirst, // after "[": whitespace, then "{" (or "]")
    kMistralArrayAfter, // after a call in the array: whitespace, then "," or "]"
    kMistralArrayNext,  // after ",": whitespace, then "{"
    kMistralName,       // a name before [ARGS] or [CALL_ID]
    kMistralCallId,     // an id before [ARGS]
    kMistralArgs,       // after [ARGS]: whitespace, then "{"
    kMistralArgsValue,  // the arguments' JSON
    kObject,       // a JSON call object
    kPyStart,      // the output's start: whitespace, <|python_start|>, whitespace, then "["
    kPyHead,       // after "[": whitespace, a name, whitespace, then "(" (or "]")
    kPyList,       // the rest of the list, up to its "]"
    kPyAfter,      // after the list: whitespace, then <|python_end|>
  };
  // Where a JSON call object is.
  enum class Obj { kOpen, kKeyOrClose, kKey, kKeyText, kColon, kValueStart, kValue, kAfterValue };
  enum class Role { kName, kArgs, kOther };
  enum class ArgsMode { kNone, kRaw, kString, kNull };

  std::string_view view(size_t a, size_t b) const { return std::string_view(t_).substr(a, b - a); }
  bool more() const { return pos_ < t_.size(); }
  // Skips whitespace; false when the text so far ends in it.
  bool skip_ws() {
    while (pos_ < t_.size() && is_ws(t_[pos_])) ++pos_;
    return pos_ < t_.size();
  }

  // ---- the answer, with whitespace held back until it is known whether a call follows ----
  void content(size_t a, size_t b) {
    if (a >= b) return;
    const std::string_view s = view(a, b);
    const size_t last = s.find_last_not_of(" \t\r\n");
    if (last == std::string_view::npos) {
      held_ws_.append(s);
      return;
    }
    out_->content += held_ws_;
    out_->content.append(s.substr(0, last + 1));
    held_ws_.assign(s.substr(last + 1));
    after_call_ = false;
  }

  // The text from pend_ up to `p` is answer after all; scanning goes on there as answer.
  bool to_content(size_t p) {
    content(pend_, p);
    pos_ = pend_ = p;
    state_ = (format_ == Format::kHermes || format_ == Format::kMistral) ? St::kContent : St::kPlain;
    return true;
  }

  // ---- calls ----
  ToolCallDelta& call_delta() {
    if (out_->tool_calls.empty() || out_->tool_calls.back().index != index_) {
      out_->tool_calls.emplace_back();
      out_->tool_calls.back().index = index_;
    }
    return out_->tool_calls.back();
  }
  void emit_args(std::string_view s) {
    if (s.empty()) return;
    call_delta().arguments.append(s);
    args_emitted_ = true;
  }
  void begin_call() {
    call_open_ = false;
    args_emitted_ = false;
    have_name_ = false;
    mode_ = ArgsMode::kNone;
    args_done_ = false;
    string_sent_ = false;
  }
  void commit() {
    held_ws_.clear();  // whitespace right before a call
    call_delta().name = std::move(name_);
    call_open_ = true;
    flush_args();
  }
  // Sends the arguments' text that became certain.
  void flush_args() {
    if (!call_open_) return;
    if (mode_ == ArgsMode::kRaw) {
      const size_t upto = args_done_ ? args_end_ : pos_;
      if (upto > args_sent_) {
        emit_args(view(args_sent_, upto));
        args_sent_ = upto;
      }
    } else if (mode_ == ArgsMode::kString && args_done_ && !string_sent_) {
      emit_args(string_args_);
      string_sent_ = true;
    }
  }
  // The open call ends with the text up to pos_ (whole, or cut short there).
  void end_call() {
    flush_args();
    if (mode_ == ArgsMode::kString && !args_done_) emit_args(view(args_begin_, pos_));
    if (!args_emitted_) emit_args("{}");
    ++index_;
    call_open_ = false;
    after_call_ = true;
    pend_ = pos_;
  }

  // ---- JSON call objects ----
  bool begin_object(St after) {
    begin_call();
    obj_ = Obj::kOpen;
    obj_after_ = after;
    state_ = St::kObject;
    return true;
  }
  // The object cannot go on at `p`.
  bool object_fault(size_t p) {
    if (!call_open_) return to_content(p);
    pos_ = p;
    end_call();
    return to_content(p);
  }
  // A value at the object's top level ended at pos_.
  bool value_ended() {
    obj_ = Obj::kAfterValue;
    if (role_ == Role::kName) {
      const json name = json::parse(view(value_begin_, pos_), nullptr, false);
      if (!name.is_string() || name.get_ref<const std::string&>().empty()) return object_fault(pos_);
      have_name_ = true;
      name_ = name.get<std::string>();
      if (mode_ != ArgsMode::kNone) commit();  // the arguments came first
    } else if (role_ == Role::kArgs) {
      args_done_ = true;
      args_end_ = pos_;
      if (mode_ == ArgsMode::kString) {
        const json decoded = json::parse(view(args_begin_, pos_), nullptr, false);
        std::string_view object;
        if (decoded.is_string() && json_object_text(decoded.get_ref<const std::string&>(), object)) {
          string_args_.assign(object);
        } else {
          string_args_.assign(view(args_begin_, pos_));
        }
      }
      flush_args();
    }
    return false;
  }
  bool object_step() {
    while (more()) {
      const char c = t_[pos_];
      switch (obj_) {
        case Obj::kOpen:
          if (c != '{') return object_fault(pos_);
          ++pos_;
          obj_ = Obj::kKeyOrClose;
          break;
        case Obj::kKeyOrClose:
        case Obj::kKey:
          if (is_ws(c)) {
            ++pos_;
            break;
          }
          if (c == '}' && obj_ == Obj::kKeyOrClose) {
            ++pos_;
            return object_closed();
          }
          if (c != '"') return object_fault(pos_);
          value_begin_ = pos_++;
          scanner_.reset();
          scanner_.feed(c);
          obj_ = Obj::kKeyText;
          break;
        case Obj::kKeyText: {
          const JsonScanner::Feed f = scanner_.feed(c);
          if (f == JsonScanner::kBad) return object_fault(pos_);
          ++pos_;
          if (f == JsonScanner::kDone) {
            const std::string_view key = view(value_begin_, pos_);
            if (key == "\"name\"" && !have_name_) {
              role_ = Role::kName;
            } else if ((key == "\"arguments\"" || key == "\"parameters\"") && mode_ == ArgsMode::kNone) {
              role_ = Role::kArgs;
            } else {
              role_ = Role::kOther;
            }
            obj_ = Obj::kColon;
          }
          break;
        }
        case Obj::kColon:
          if (is_ws(c)) {
            ++pos_;
            break;
          }
          if (c != ':') return object_fault(pos_);
          ++pos_;
          obj_ = Obj::kValueStart;
          break;
        case Obj::kValueStart:
          if (is_ws(c)) {
            ++pos_;
            break;
          }
          if (role_ == Role::kName && c != '"') return object_fault(pos_);
          scanner_.reset();
          if (scanner_.feed(c) == JsonScanner::kBad) return object_fault(pos_);
          value_begin_ = pos_;
          ++pos_;
          obj_ = Obj::kValue;
          if (role_ == Role::kArgs) {
            mode_ = c == '"' ? ArgsMode::kString : c == 'n' ? ArgsMode::kNull : ArgsMode::kRaw;
            args_begin_ = args_sent_ = value_begin_;
            if (have_name_) commit();  // the name, then the arguments as they come
          }
          break;
        case Obj::kValue: {
          const JsonScanner::Feed f = scanner_.feed(c);
          if (f == JsonScanner::kBad) return object_fault(pos_);
          if (f == JsonScanner::kTake) {
            ++pos_;
            break;
          }
          if (f == JsonScanner::kDone) ++pos_;
          if (value_ended()) return true;
          break;
        }
        case Obj::kAfterValue:
          if (is_ws(c)) {
            ++pos_;
            break;
          }
          if (c == ',') {
            ++pos_;
            obj_ = Obj::kKey;
            break;
          }
          if (c != '}') return object_fault(pos_);
          ++pos_;
          return object_closed();
      }
    }
    if (end_) return object_fault(pos_);
    return false;
  }
  bool object_closed() {
    if (!have_name_) return to_content(pos_);  // no name: text
    if (!call_open_) commit();                 // no arguments
    end_call();
    state_ = obj_after_;
    return true;
  }

  // ---- the formats' own syntax ----
  bool step() {
    switch (state_) {
      case St::kContent: {
        const std::string_view tag = format_ == Format::kHermes ? "<tool_call>" : "[TOOL_CALLS]";
        const size_t at = t_.find(tag, pos_);
        if (at == std::string::npos) {
          const size_t keep = end_ ? 0 : partial_tag(view(pos_, t_.size()), tag);
          content(pos_, t_.size() - keep);
          pos_ = pend_ = t_.size() - keep;
          return false;
        }
        content(pos_, at);
        pend_ = at;
        pos_ = at + tag.size();
        state_ = format_ == Format::kHermes ? St::kHermesOpen : St::kMistralStart;
        return true;
      }
      case St::kPlain:
        content(pos_, t_.size());
        pos_ = pend_ = t_.size();
        return false;

      case St::kHermesOpen:
        if (!skip_ws()) return end_ && to_content(pos_);
        if (t_[pos_] != '{') return to_content(pos_);
        return begin_object(St::kHermesClose);
      case St::kHermesClose: {
        if (!skip_ws() && !end_) return false;
        const Match m = match_at(t_, pos_, "</tool_call>", end_);
        if (m == Match::kMaybe) return false;
        if (m == Match::kNo) return to_content(pend_);  // the answer goes on after the object
        pos_ = pend_ = pos_ + 12;
        state_ = St::kContent;
        return true;
      }

      case St::kLlamaStart: {
        if (!skip_ws()) return end_ && to_content(pos_);
        if (!tag_checked_) {
          const Match m = match_at(t_, pos_, "<|python_tag|>", end_);
          if (m == Match::kMaybe) return false;
          tag_checked_ = true;
          if (m == Match::kYes) pos_ += 14;
          return true;
        }
        if (t_[pos_] != '{') return to_content(pos_);
        return begin_object(St::kLlamaAfter);
      }
      case St::kLlamaAfter:
        if (!skip_ws()) return end_ && to_content(pend_);
        if (t_[pos_] != ';') return to_content(pend_);
        ++pos_;
        state_ = St::kLlamaNext;
        return true;
      case St::kLlamaNext:
        if (!skip_ws()) return end_ && to_content(pend_);
        if (t_[pos_] != '{') return to_content(pend_);
        return begin_object(St::kLlamaAfter);

      case St::kMistralStart: {
        if (!skip_ws()) return end_ && to_content(pos_);
        const char c = t_[pos_];
        if (c == '[') {
          ++pos_;
          state_ = St::kMistralArrayFirst;
          return true;
        }
        if (c == '{') return begin_object(St::kContent);
        if (!is_name_char(c)) return to_content(pos_);
        name_begin_ = id_begin_ = pos_;
        state_ = St::kMistralName;
        return true;
      }
      case St::kMistralArrayFirst:
        if (!skip_ws()) return end_ && to_content(pos_);
        if (t_[pos_] == ']') return to_content(pos_ + 1);  // [TOOL_CALLS][] calls nothing: text
        if (t_[pos_] != '{') return to_content(pos_);
        return begin_object(St::kMistralArrayAfter);
      case St::kMistralArrayAfter:
        if (!skip_ws()) return end_ && to_content(pend_);
        if (t_[pos_] == ',') {
          ++pos_;
          state_ = St::kMistralArrayNext;
          return true;
        }
        if (t_[pos_] != ']') return to_content(pend_);
        pos_ = pend_ = pos_ + 1;
        state_ = St::kContent;
        return true;
      case St::kMistralArrayNext:
        if (!skip_ws()) return end_ && to_content(pend_);
        if (t_[pos_] != '{') return to_content(pend_);
        return begin_object(St::kMistralArrayAfter);
      case St::kMistralName:
      case St::kMistralCallId: {
        while (more() && is_name_char(t_[pos_])) {
          ++pos_;
          if (pos_ - id_begin_ > kMaxMistralName) return to_content(pos_);
        }
        if (!more()) return end_ && to_content(pos_);
        if (state_ == St::kMistralName) {
          const Match id = match_at(t_, pos_, "[CALL_ID]", end_);
          if (id == Match::kYes) {
            name_end_ = pos_;
            pos_ += 9;
            id_begin_ = pos_;
            state_ = St::kMistralCallId;
            return true;
          }
          if (id == Match::kMaybe) return false;
          name_end_ = pos_;
        }
        const Match m = match_at(t_, pos_, "[ARGS]", end_);
        if (m == Match::kMaybe) return false;
        if (m == Match::kNo) return to_content(pos_);
        pos_ += 6;
        state_ = St::kMistralArgs;
        return true;
      }
      case St::kMistralArgs:
        if (!skip_ws()) return end_ && to_content(pos_);
        if (t_[pos_] != '{') return to_content(pos_);
        begin_call();
        name_ = view(name_begin_, name_end_);
        commit();
        scanner_.reset();
        scanner_.feed('{');
        mode_ = ArgsMode::kRaw;
        args_begin_ = args_sent_ = pos_++;
        state_ = St::kMistralArgsValue;
        return true;
      case St::kMistralArgsValue:
        while (more()) {
          const JsonScanner::Feed f = scanner_.feed(t_[pos_]);
          if (f == JsonScanner::kBad) return object_fault(pos_);
          ++pos_;
          if (f == JsonScanner::kDone) {
            args_done_ = true;
            args_end_ = pos_;
            end_call();
            state_ = St::kContent;
            return true;
          }
        }
        return end_ && object_fault(pos_);

      case St::kObject:
        return object_step();

      case St::kPyStart: {
        if (!skip_ws()) return end_ && to_content(pos_);
        if (!tag_checked_) {
          const Match m = match_at(t_, pos_, "<|python_start|>", end_);
          if (m == Match::kMaybe) return false;
          tag_checked_ = true;
          if (m == Match::kYes) pos_ += 16;
          return true;
        }
        if (t_[pos_] != '[') return to_content(pos_);
        list_begin_ = pos_++;
        depth_ = 1;
        head_ = 0;
        state_ = St::kPyHead;
        return true;
      }
      case St::kPyHead:
        // A call list's start: "[", a name, "("; checked early so that other text does not wait.
        while (more()) {
          const char c = t_[pos_];
          if (head_ == 0) {  // whitespace, then the name or "]"
            if (is_ws(c)) {
              ++pos_;
            } else if (c == ']') {
              state_ = St::kPyList;
              return true;
            } else if (is_ident_start(c)) {
              head_ = 1;
            } else {
              return to_content(pos_);
            }
          } else if (head_ == 1) {  // the name
            if (is_ident(c)) {
              ++pos_;
            } else {
              head_ = 2;
            }
          } else {  // whitespace, then "("
            if (is_ws(c)) {
              ++pos_;
            } else if (c == '(') {
              ++pos_;
              depth_ = 2;
              state_ = St::kPyList;
              return true;
            } else {
              return to_content(pos_);
            }
          }
        }
        return end_ && to_content(pos_);
      case St::kPyList:
        return python_list_step();
      case St::kPyAfter: {
        if (!skip_ws() && !end_) return false;
        const Match m = match_at(t_, pos_, "<|python_end|>", end_);
        if (m == Match::kMaybe) return false;
        if (m == Match::kNo) return to_content(pend_);
        pos_ = pend_ = pos_ + 14;
        state_ = St::kPlain;
        return true;
      }
    }
    return false;
  }

  // Finds the list's closing "]" (brackets outside strings), then parses the list once.
  bool python_list_step() {
    while (more()) {
      const char c = t_[pos_];
      if (quote_ == 0) {
        if (c == '"' || c == '\'') {
          if (pos_ + 2 >= t_.size() && !end_) return false;  // a triple quote or not?
          triple_ = pos_ + 2 < t_.size() && t_[pos_ + 1] == c && t_[pos_ + 2] == c;
          quote_ = c;
          pos_ += triple_ ? 3 : 1;
          continue;
        }
        ++pos_;
        if (c == '(' || c == '[' || c == '{') {
          ++depth_;
        } else if ((c == ')' || c == ']' || c == '}') && --depth_ == 0) {
          return python_list_closed();
        }
        continue;
      }
      if (c == '\\') {
        if (pos_ + 1 >= t_.size() && !end_) return false;
        pos_ += 2;
        continue;
      }
      if (c == quote_) {
        if (!triple_) {
          quote_ = 0;
          ++pos_;
          continue;
        }
        if (pos_ + 2 >= t_.size() && !end_) return false;
        if (pos_ + 2 < t_.size() && t_[pos_ + 1] == c && t_[pos_ + 2] == c) {
          quote_ = 0;
          pos_ += 3;
          continue;
        }
      }
      ++pos_;
    }
    pos_ = std::min(pos_, t_.size());
    return end_ && to_content(pos_);
  }
  bool python_list_closed() {
    std::vector<ParsedToolCall> calls;
    if (!PythonCalls(view(list_begin_, pos_)).parse(calls)) return to_content(pos_);
    held_ws_.clear();
    for (ParsedToolCall& call : calls) {
      ToolCallDelta& d = call_delta();
      d.name = std::move(call.name);
      d.arguments = std::move(call.arguments);
      ++index_;
    }
    after_call_ = true;
    pend_ = pos_;
    state_ = St::kPyAfter;
    return true;
  }

  const Format format_;
  St state_;
  std::string t_;       // the answer so far
  size_t pos_ = 0;      // the next byte to look at
  size_t pend_ = 0;     // the start of text that is not answer yet and not a call's either
  bool end_ = false;    // t_ is the whole answer
  bool done_ = false;
  OutputDelta* out_ = nullptr;

  std::string held_ws_;     // the answer's whitespace not sent yet
  bool after_call_ = false; // no answer text since the last call

  int index_ = 0;           // the current (or next) call's index
  bool call_open_ = false;  // the current call's name went out
  bool have_name_ = false;
  std::string name_;        // the current call's name, until it goes out
  bool args_emitted_ = false;
  ArgsMode mode_ = ArgsMode::kNone;
  bool args_done_ = false;
  bool string_sent_ = false;
  size_t args_begin_ = 0, args_end_ = 0, args_sent_ = 0;
  std::string string_args_;  // a string's arguments, decided when it closed

  Obj obj_ = Obj::kOpen;
  St obj_after_ = St::kContent;
  Role role_ = Role::kOther;
  size_t value_begin_ = 0;
  JsonScanner scanner_;

  bool tag_checked_ = false;  // <|python_tag|> / <|python_start|> looked for
  size_t name_begin_ = 0, name_end_ = 0, id_begin_ = 0;  // mistral's name[CALL_ID]id[ARGS]
  size_t list_begin_ = 0;
  int64_t depth_ = 0;
  int head_ = 0;
  char quote_ = 0;
  bool triple_ = false;
};

class FormatToolParser final : public ToolParser {
 public:
  explicit FormatToolParser(Format format) : format_(format) {}
  std::unique_ptr<Scanner> start() const override { return std::make_unique<ToolScanner>(format_); }
  bool needs_special_tokens() const override { return format_ == Format::kMistral; }

 private:
  Format format_;
};

}  // namespace

void ReasoningParser::parse(std::string_view text, std::string& reasoning, std::string& rest, bool& found) const {
  reasoning.clear();
  rest.clear();
  const std::unique_ptr<Splitter> splitter = start();
  splitter->push(text, true, reasoning, rest);
  found = splitter->found();
}

void ToolParser::parse(std::string_view text, std::string& content, std::vector<ParsedToolCall>& calls) const {
  OutputDelta out;
  start()->push(text, true, out);
  content = std::move(out.content);
  calls.clear();
  for (ToolCallDelta& d : out.tool_calls) calls.push_back({d.name.value_or(""), std::move(d.arguments)});
}

Result<std::unique_ptr<ReasoningParser>> make_reasoning_parser(std::string_view name) {
  if (name == "qwen3") return std::unique_ptr<ReasoningParser>(std::make_unique<ThinkParser>(false));
  if (name == "deepseek_r1") return std::unique_ptr<ReasoningParser>(std::make_unique<ThinkParser>(true));
  return invalid_argument("unknown reasoning parser '" + std::string(name) + "' (known: deepseek_r1, qwen3)");
}

Result<std::unique_ptr<ToolParser>> make_tool_parser(std::string_view name) {
  Format format;
  if (name == "hermes") {
    format = Format::kHermes;
  } else if (name == "llama3_json") {
    format = Format::kLlama3Json;
  } else if (name == "mistral") {
    format = Format::kMistral;
  } else if (name == "pythonic") {
    format = Format::kPythonic;
  } else {
    return invalid_argument("unknown tool call parser '" + std::string(name) +
                            "' (known: hermes, llama3_json, mistral, pythonic)");
  }
  return std::unique_ptr<ToolParser>(std::make_unique<FormatToolParser>(format));
}

OutputStream::OutputStream(const ReasoningParser* reasoning, const ToolParser* tools)
    : splitter_(reasoning != nullptr ? reasoning->start() : nullptr),
      scanner_(tools != nullptr ? tools->start() : nullptr) {}

void OutputStream::feed(std::string_view piece, bool end, OutputDelta& out) {
  if (finished_) return;
  std::string rest;
  if (splitter_ != nullptr) {
    splitter_->push(piece, end, out.reasoning, rest);
    piece = rest;
  }
  if (scanner_ != nullptr) {
    scanner_->push(piece, end, out);
  } else {
    out.content.append(piece);
  }
  finished_ = end;
}

OutputDelta OutputStream::push(std::string_view piece) {
  OutputDelta out;
  feed(piece, false, out);
  return out;
}

OutputDelta OutputStream::finish() {
  OutputDelta out;
  feed({}, true, out);
  return out;
}

ParsedOutput parse_output(std::string_view text, const ReasoningParser* reasoning, const ToolParser* tools) {
  OutputStream stream(reasoning, tools);
  OutputDelta out = stream.push(text);
  OutputDelta last = stream.finish();
  ParsedOutput parsed;
  parsed.content = std::move(out.content) + last.content;
  if (stream.reasoning_found()) parsed.reasoning = std::move(out.reasoning) + last.reasoning;
  for (const OutputDelta* d : {&out, &last}) {
    for (const ToolCallDelta& c : d->tool_calls) {
      if (static_cast<size_t>(c.index) >= parsed.tool_calls.size()) parsed.tool_calls.resize(c.index + 1);
      ParsedToolCall& call = parsed.tool_calls[c.index];
      if (c.name) call.name = *c.name;
      call.arguments += c.arguments;
    }
  }
  return parsed;
}

}  // namespace pagoda::server
