// Lexer and parser of the Jinja subset (see chat_template.h). The lexer applies the
// whitespace rules Hugging Face renders with (trim_blocks, lstrip_blocks, '-' and '+'
// markers, one trailing newline of the source dropped) so that the tree holds final text.
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "tokenizer/jinja_ast.h"
#include "tokenizer/unicode.h"

namespace pagoda::jinja {
namespace {

// Deeper nesting than this (brackets, operators, blocks) is refused rather than risking the
// stack on hostile input.
constexpr int kMaxParseDepth = 96;

[[noreturn]] void fail(const std::string& message, int line, int col) {
  throw ParseError{message, line, col};
}

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }
bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// ---- lexer -----------------------------------------------------------------------------------

struct Token {
  enum class Kind { kName, kString, kInt, kFloat, kOp, kEnd };
  Kind kind;
  std::string text;  // name, decoded string, number text, or operator
  int line, col;
};

struct Segment {
  enum class Kind { kText, kVar, kBlock, kComment };
  Kind kind;
  std::string text;           // kText
  std::vector<Token> tokens;  // kVar, kBlock (ends with kEnd)
  char open_mark = 0;         // '-' or '+' right after the opening delimiter
  char close_mark = 0;        // '-' or '+' right before the closing delimiter
  bool raw_begin = false;     // {% raw %}: Jinja2 does not trim the newline after it
  size_t start = 0;           // offset in the source
  int line = 0, col = 0;
};

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {}

  std::vector<Segment> run() {
    std::vector<Segment> segs;
    size_t text_start = 0;
    while (pos_ < src_.size()) {
      size_t open = find_open(pos_);
      if (open == std::string::npos) break;
      add_text(segs, text_start, open);
      seek(open);
      char kind_char = src_[open + 1];
      Segment seg;
      seg.start = open;
      seg.line = line_;
      seg.col = col_;
      advance(2);
      if (pos_ < src_.size() && (src_[pos_] == '-' || src_[pos_] == '+')) {
        seg.open_mark = src_[pos_];
        advance(1);
      }
      if (kind_char == '#') {
        seg.kind = Segment::Kind::kComment;
        size_t end = src_.find("#}", pos_);
        if (end == std::string::npos) fail("unterminated comment", seg.line, seg.col);
        if (end > pos_ && (src_[end - 1] == '-' || src_[end - 1] == '+')) seg.close_mark = src_[end - 1];
        seek(end + 2);
      } else {
        seg.kind = kind_char == '{' ? Segment::Kind::kVar : Segment::Kind::kBlock;
        lex_tag(seg, kind_char == '{' ? '}' : '%');
      }
      segs.push_back(std::move(seg));
      // {% raw %}: everything up to {% endraw %} is text.
      Segment& last = segs.back();
      if (last.kind == Segment::Kind::kBlock && last.tokens.size() == 2 &&
          last.tokens[0].kind == Token::Kind::kName && last.tokens[0].text == "raw") {
        last.raw_begin = true;
        lex_raw(segs);
      }
      text_start = pos_;
    }
    add_text(segs, text_start, src_.size());
    apply_whitespace_rules(segs);
    return segs;
  }

 private:
  size_t find_open(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  void seek(size_t to) {
    while (pos_ < to) advance(1);
  }
  void advance(size_t n) {
    for (size_t i = 0; i < n && pos_ < src_.size(); ++i) {
      if (src_[pos_] == '\n') {
        ++line_;
        col_ = 1;
      } else {
        ++col_;
      }
      ++pos_;
    }
  }

  void add_text(std::vector<Segment>& segs, size_t from, size_t to) {
    if (to <= from) return;
    Segment seg;
    seg.kind = Segment::Kind::kText;
    seg.text = src_.substr(from, to - from);
    seg.start = from;
    segs.push_back(std::move(seg));
  }

  void lex_raw(std::vector<Segment>& segs) {
    // Find "{%" [-+] ws "endraw" ws [-+] "%}".
    size_t search = pos_;
    while (true) {
      size_t open = src_.find("{%", search);
      if (open == std::string::npos) fail("missing {% endraw %}", line_, col_);
      size_t i = open + 2;
      char open_mark = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) open_mark = src_[i++];
      while (i < src_.size() && is_space(src_[i])) ++i;
      if (src_.compare(i, 6, "endraw") != 0) {
        search = open + 2;
        continue;
      }
      i += 6;
      while (i < src_.size() && is_space(src_[i])) ++i;
      char close_mark = 0;
      if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) close_mark = src_[i++];
      if (src_.compare(i, 2, "%}") != 0) {
        search = open + 2;
        continue;
      }
      add_text(segs, pos_, open);
      Segment end;
      end.kind = Segment::Kind::kBlock;
      end.start = open;
      end.line = line_;
      end.col = col_;
      end.open_mark = open_mark;
      end.close_mark = close_mark;
      end.tokens.push_back(Token{Token::Kind::kName, "endraw", line_, col_});
      end.tokens.push_back(Token{Token::Kind::kEnd, "", line_, col_});
      seek(i + 2);
      segs.push_back(std::move(end));
      return;
    }
  }

  // Tokens of one {{ }} or {% %} tag, up to its closing delimiter ("}}" or "%}").
  void lex_tag(Segment& seg, char close) {
    int braces = 0;  // open '{' '[' '(' inside the tag: "}}" closes the tag only outside them
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance(1);
      if (pos_ >= src_.size()) fail("unterminated tag", seg.line, seg.col);
      char c = src_[pos_];
      int line = line_, col = col_;
      // The closing delimiter, optionally preceded by '-' or '+'.
      for (char mark : {'-', '+', '\0'}) {
        size_t at = pos_ + (mark ? 1 : 0);
        if (mark && c != mark) continue;
        if (braces == 0 && at + 1 < src_.size() && src_[at] == close && src_[at + 1] == '}') {
          seg.close_mark = mark;
          advance(at + 2 - pos_);
          seg.tokens.push_back(Token{Token::Kind::kEnd, "", line, col});
          return;
        }
      }
      if (is_name_start(c)) {
        size_t b = pos_;
        while (pos_ < src_.size() && (is_name_start(src_[pos_]) || is_digit(src_[pos_]))) advance(1);
        seg.tokens.push_back(Token{Token::Kind::kName, src_.substr(b, pos_ - b), line, col});
      } else if (is_digit(c)) {
        lex_number(seg, line, col);
      } else if (c == '\'' || c == '"') {
        seg.tokens.push_back(Token{Token::Kind::kString, lex_string(), line, col});
      } else {
        static const char* const kOps[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                           "]",  "{",  "}",  ",",  ".",  ":",  "|"};
        const char* op = nullptr;
        for (const char* candidate : kOps) {
          if (src_.compare(pos_, std::strlen(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (!op) fail(std::string("unexpected character '") + c + "'", line, col);
        if (*op == '(' || *op == '[' || *op == '{') ++braces;
        if ((*op == ')' || *op == ']' || *op == '}') && braces > 0) --braces;
        advance(std::strlen(op));
        seg.tokens.push_back(Token{Token::Kind::kOp, op, line, col});
      }
    }
  }

  void lex_number(Segment& seg, int line, int col) {
    size_t b = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (is_digit(src_[pos_]) || (src_[pos_] == '_' && pos_ + 1 < src_.size() &&
                                                             is_digit(src_[pos_ + 1]))))
        advance(1);
    };
    digits();
    bool is_float = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && is_digit(src_[pos_ + 1])) {
      is_float = true;
      advance(1);
      digits();
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t e = pos_ + 1;
      if (e < src_.size() && (src_[e] == '+' || src_[e] == '-')) ++e;
      if (e < src_.size() && is_digit(src_[e])) {
        is_float = true;
        advance(e - pos_);
        digits();
      }
    }
    std::string text;
    for (size_t i = b; i < pos_; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    seg.tokens.push_back(Token{is_float ? Token::Kind::kFloat : Token::Kind::kInt, text, line, col});
  }



  static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }

  // A quoted string with Python's escapes (as Jinja decodes them); unknown escapes stay as written.
  std::string lex_string() {
    int line = line_, col = col_;
    char quote = src_[pos_];
    advance(1);
    std::string out;
    while (true) {
      if (pos_ >= src_.size()) fail("unterminated string", line, col);
      char c = src_[pos_];
      if (c == quote) {
        advance(1);
        return out;
      }
      if (c != '\\') {
        out.push_back(c);
        advance(1);
        continue;
      }
      if (pos_ + 1 >= src_.size()) fail("unterminated string", line, col);
      char e = src_[pos_ + 1];
      advance(2);
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case '\\':
          out.push_back('\\');
          break;
        case '\'':
          out.push_back('\'');
          break;
        case '"':
          out.push_back('"');
          break;
        case 'a':
          out.push_back('\a');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          int n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (int i = 0; i < n; ++i) {
            int h = pos_ < src_.size() ? hex_value(src_[pos_]) : -1;
            if (h < 0) fail("truncated \\" + std::string(1, e) + " escape", line, col);
            cp = cp * 16 + static_cast<uint32_t>(h);
            advance(1);
          }
          unicode::append_utf8(static_cast<char32_t>(cp), out);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && pos_ < src_.size() && src_[pos_] >= '0' && src_[pos_] <= '7'; ++i) {
              cp = cp * 8 + static_cast<uint32_t>(src_[pos_] - '0');
              advance(1);
            }
            unicode::append_utf8(static_cast<char32_t>(cp), out);
          } else {
            out.push_back('\\');
            out.push_back(e);
          }
      }
    }
  }

  // trim_blocks, lstrip_blocks and the '-' / '+' markers, as Jinja2's lexer applies them.
  void apply_whitespace_rules(std::vector<Segment>& segs) {
    for (size_t i = 0; i < segs.size(); ++i) {
      Segment& seg = segs[i];
      if (seg.kind != Segment::Kind::kText) continue;
      size_t start = seg.start;
      std::string& t = seg.text;
      if (i > 0) {
        const Segment& prev = segs[i - 1];
        if (prev.close_mark == '-') {
          size_t n = 0;
          while (n < t.size() && is_space(t[n])) ++n;
          t.erase(0, n);
          start += n;
        } else if (prev.kind != Segment::Kind::kVar && prev.close_mark != '+' && !prev.raw_begin &&
                   !t.empty() && t[0] == '\n') {
          t.erase(0, 1);
          start += 1;
        }
      }
      if (i + 1 < segs.size()) {
        const Segment& next = segs[i + 1];
        if (next.open_mark == '-') {
          size_t n = t.size();
          while (n > 0 && is_space(t[n - 1])) --n;
          t.resize(n);
        } else if (next.kind != Segment::Kind::kVar && next.open_mark != '+') {
          size_t nl = t.rfind('\n');
          bool line_start = nl != std::string::npos || start == 0 || src_[start - 1] == '\n';
          size_t from = nl == std::string::npos ? 0 : nl + 1;
          bool blank = true;
          for (size_t k = from; k < t.size(); ++k) blank = blank && (t[k] == ' ' || t[k] == '\t');
          if (line_start && blank) t.resize(from);
        }
      }
    }
    // A text directly after "-%}" etc. that became empty, and the lstrip of a text before a
    // tag that follows another tag with nothing between them, need no further work.
  }

  const std::string& src_;
  size_t pos_ = 0;
  int line_ = 1, col_ = 1;
};

// ---- parser ------------------------------------------------------------------------------------

class Parser {
 public:
  explicit Parser(std::vector<Segment> segs) : segs_(std::move(segs)) {}

  Body parse() {
    std::string end;
    Token top{Token::Kind::kEnd, "", 1, 1};
    return parse_body({}, &end, top);
  }

 private:
  // ---- statements ----

  // Parses segments until a block tag whose keyword is in `ends` (which is consumed; its name
  // is stored in *end and the tag's tokens are left for the caller at tok_).
  Body parse_body(const std::vector<std::string>& ends, std::string* end, const Token& opener) {
    DepthGuard guard(this, seg_ < segs_.size() ? segs_[seg_].line : 0, 0);
    Body body;
    while (seg_ < segs_.size()) {
      Segment& seg = segs_[seg_++];
      switch (seg.kind) {
        case Segment::Kind::kText:
          if (!seg.text.empty()) {
            auto s = std::make_unique<Stmt>();
            s->kind = Stmt::Kind::kText;
            s->text = std::move(seg.text);
            body.push_back(std::move(s));
          }
          break;
        case Segment::Kind::kComment:
          break;
        case Segment::Kind::kVar: {
          start_tokens(seg);
          auto s = make_stmt(Stmt::Kind::kOutput);
          s->expr = parse_expression();
          expect_end();
          body.push_back(std::move(s));
          break;
        }
        case Segment::Kind::kBlock: {
          start_tokens(seg);
          const Token& kw = peek();
          if (kw.kind != Token::Kind::kName) fail("expected a statement name", kw.line, kw.col);
          for (const std::string& e : ends) {
            if (kw.text == e) {
              next();
              *end = e;
              return body;
            }
          }
          body.push_back(parse_statement());
          break;
        }
      }
    }
    if (!ends.empty()) {
      fail("'" + opener.text + "' is never closed (expected '" + ends.back() +
               "' before the end of the template)",
           opener.line, opener.col);
    }
    return body;
  }

  StmtPtr make_stmt(Stmt::Kind kind) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = peek().line;
    s->col = peek().col;
    return s;
  }

  StmtPtr parse_statement() {
    Token kw = next();
    const std::string& k = kw.text;
    auto s = std::make_unique<Stmt>();
    s->line = kw.line;
    s->col = kw.col;
    std::string end;
    if (k == "if") {
      s->kind = Stmt::Kind::kIf;
      s->conditions.push_back(parse_expression());
      expect_end();
      while (true) {
        s->bodies.push_back(parse_body({"elif", "else", "endif"}, &end, kw));
        if (end == "elif") {
          s->conditions.push_back(parse_expression());
          expect_end();
        } else if (end == "else") {
          expect_end();
          s->bodies.push_back(parse_body({"endif"}, &end, kw));
          expect_end();
          break;
        } else {
          expect_end();
          break;
        }
      }
    } else if (k == "for") {
      s->kind = Stmt::Kind::kFor;
      s->targets = parse_targets();
      expect_name("in");
      s->expr = parse_expression(/*allow_condition=*/false);
      if (peek_name("if")) {
        next();
        s->condition = parse_expression();
      }
      if (peek_name("recursive")) fail("recursive loops are not supported", peek().line, peek().col);
      expect_end();
      ++loop_depth_;
      s->bodies.push_back(parse_body({"else", "endfor"}, &end, kw));
      --loop_depth_;
      s->uses_loop = body_mentions(s->bodies[0], "loop");
      if (end == "else") {
        expect_end();
        s->bodies.push_back(parse_body({"endfor"}, &end, kw));
      }
      expect_end();
    } else if (k == "set") {
      s->kind = Stmt::Kind::kSet;
      const Token& name = expect(Token::Kind::kName, "a variable name");
      s->targets.push_back(name.text);
      if (peek_op(".")) {
        next();
        s->text = expect(Token::Kind::kName, "an attribute name").text;
      } else {
        while (peek_op(",")) {
          next();
          s->targets.push_back(expect(Token::Kind::kName, "a variable name").text);
        }
      }
      if (peek_op("=")) {
        next();
        s->expr = parse_tuple_or_expression();
        expect_end();
      } else {
        if (s->targets.size() != 1 || !s->text.empty()) fail("expected '='", peek().line, peek().col);
        expect_end();
        s->bodies.push_back(parse_body({"endset"}, &end, kw));
        expect_end();
      }
    } else if (k == "macro") {
      s->kind = Stmt::Kind::kMacro;
      s->text = expect(Token::Kind::kName, "a macro name").text;
      expect_op("(");
      while (!peek_op(")")) {
        s->targets.push_back(expect(Token::Kind::kName, "a parameter name").text);
        if (peek_op("=")) {
          next();
          s->defaults.push_back(parse_expression());
        } else {
          s->defaults.push_back(nullptr);
        }
        if (!peek_op(",")) break;
        next();
      }
      expect_op(")");
      expect_end();
      int saved_loop_depth = loop_depth_;
      loop_depth_ = 0;
      s->bodies.push_back(parse_body({"endmacro"}, &end, kw));
      loop_depth_ = saved_loop_depth;
      if (peek().kind == Token::Kind::kName) next();  // {% endmacro name %}
      expect_end();
    } else if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail("'" + k + "' outside of a loop", kw.line, kw.col);
      s->kind = k == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      expect_end();
    } else if (k == "generation") {
      s->kind = Stmt::Kind::kBlock;
      expect_end();
      s->bodies.push_back(parse_body({"endgeneration"}, &end, kw));
      expect_end();
    } else if (k == "raw") {
      s->kind = Stmt::Kind::kBlock;
      expect_end();
      s->bodies.push_back(parse_body({"endraw"}, &end, kw));
      expect_end();
    } else {
      fail("unknown or unsupported statement '" + k + "'", kw.line, kw.col);
    }
    return s;
  }

  // True when `name` appears as a variable anywhere in `body` (nested loops, macros included).
  static bool expr_mentions(const Expr* e, const std::string& name) {
    if (!e) return false;
    if (e->kind == Expr::Kind::kName && e->name == name) return true;
    for (const ExprPtr& c : e->children) {
      if (expr_mentions(c.get(), name)) return true;
    }
    return false;
  }
  static bool body_mentions(const Body& body, const std::string& name) {
    for (const StmtPtr& s : body) {
      if (expr_mentions(s->expr.get(), name) || expr_mentions(s->condition.get(), name)) return true;
      for (const ExprPtr& e : s->conditions) {
        if (expr_mentions(e.get(), name)) return true;
      }
      for (const ExprPtr& e : s->defaults) {
        if (expr_mentions(e.get(), name)) return true;
      }
      for (const Body& b : s->bodies) {
        if (body_mentions(b, name)) return true;
      }
    }
    return false;
  }

  std::vector<std::string> parse_targets() {
    std::vector<std::string> names;
    bool paren = peek_op("(");
    if (paren) next();
    names.push_back(expect(Token::Kind::kName, "a loop variable").text);
    while (peek_op(",")) {
      next();
      names.push_back(expect(Token::Kind::kName, "a loop variable").text);
    }
    if (paren) expect_op(")");
    return names;
  }

  // ---- tokens ----

  void start_tokens(Segment& seg) {
    toks_ = &seg.tokens;
    tok_ = 0;
  }
  const Token& peek(size_t ahead = 0) const {
    size_t i = std::min(tok_ + ahead, toks_->size() - 1);
    return (*toks_)[i];
  }
  Token next() {
    Token t = peek();
    if (tok_ + 1 < toks_->size()) ++tok_;
    return t;
  }
  bool peek_op(const char* op) const { return peek().kind == Token::Kind::kOp && peek().text == op; }
  bool peek_name(const char* name) const { return peek().kind == Token::Kind::kName && peek().text == name; }
  static std::string describe(const Token& t) {
    return t.kind == Token::Kind::kEnd ? std::string("end of tag") : "'" + t.text + "'";
  }
  const Token& expect(Token::Kind kind, const char* what) {
    const Token& t = peek();
    if (t.kind != kind) fail(std::string("expected ") + what + ", got " + describe(t), t.line, t.col);
    ++tok_;
    return (*toks_)[tok_ - 1];
  }
  void expect_op(const char* op) {
    if (!peek_op(op))
      fail(std::string("expected '") + op + "', got " + describe(peek()), peek().line, peek().col);
    next();
  }
  void expect_name(const char* name) {
    if (!peek_name(name))
      fail(std::string("expected '") + name + "', got " + describe(peek()), peek().line, peek().col);
    next();
  }
  void expect_end() {
    if (peek().kind != Token::Kind::kEnd)
      fail("expected end of tag, got " + describe(peek()), peek().line, peek().col);
  }

  struct DepthGuard {
    DepthGuard(Parser* p, int line, int col) : p_(p) {
      if (++p_->depth_ > kMaxParseDepth) fail("template nested too deeply", line, col);
    }
    ~DepthGuard() { --p_->depth_; }
    Parser* p_;
  };

  // ---- expressions ----

  ExprPtr node(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->col = at.col;
    return e;
  }

  // `a, b` without brackets is a tuple (for `set a, b = ...` and `set x = 1, 2`).
  ExprPtr parse_tuple_or_expression() {
    Token at = peek();
    ExprPtr first = parse_expression();
    if (!peek_op(",")) return first;
    auto tuple = node(Expr::Kind::kTuple, at);
    tuple->children.push_back(std::move(first));
    while (peek_op(",")) {
      next();
      if (peek().kind == Token::Kind::kEnd) break;
      tuple->children.push_back(parse_expression());
    }
    return tuple;
  }

  ExprPtr parse_expression(bool allow_condition = true) {
    DepthGuard guard(this, peek().line, peek().col);
    Token at = peek();
    ExprPtr e = parse_or();
    if (allow_condition && peek_name("if")) {
      next();
      auto cond = node(Expr::Kind::kCondition, at);
      cond->children.push_back(std::move(e));
      cond->children.push_back(parse_or());
      if (peek_name("else")) {
        next();
        cond->children.push_back(parse_expression());
      }
      return cond;
    }
    return e;
  }

  ExprPtr binary(const Token& at, std::string op, ExprPtr l, ExprPtr r) {
    auto e = node(Expr::Kind::kBinary, at);
    e->name = std::move(op);
    e->children.push_back(std::move(l));
    e->children.push_back(std::move(r));
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (peek_name("or")) {
      Token at = next();
      l = binary(at, "or", std::move(l), parse_and());
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (peek_name("and")) {
      Token at = next();
      l = binary(at, "and", std::move(l), parse_not());
    }
    return l;
  }
  ExprPtr parse_not() {
    if (peek_name("not")) {
      DepthGuard guard(this, peek().line, peek().col);
      Token at = next();
      auto e = node(Expr::Kind::kUnary, at);
      e->name = "not";
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    Token at = peek();
    ExprPtr first = parse_math1();
    ExprPtr cmp;
    while (true) {
      std::string op;
      const Token& t = peek();
      if (t.kind == Token::Kind::kOp && (t.text == "==" || t.text == "!=" || t.text == "<" ||
                                         t.text == "<=" || t.text == ">" || t.text == ">=")) {
        op = t.text;
        next();
      } else if (peek_name("in")) {
        op = "in";
        next();
      } else if (peek_name("not") && peek(1).kind == Token::Kind::kName && peek(1).text == "in") {
        op = "not in";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = node(Expr::Kind::kCompare, at);
        cmp->children.push_back(std::move(first));
      }
      cmp->ops.push_back(op);
      cmp->children.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr l = parse_concat();
    while (peek_op("+") || peek_op("-")) {
      Token at = next();
      l = binary(at, at.text, std::move(l), parse_concat());
    }
    return l;
  }
  ExprPtr parse_concat() {
    ExprPtr l = parse_math2();
    while (peek_op("~")) {
      Token at = next();
      l = binary(at, "~", std::move(l), parse_math2());
    }
    return l;
  }
  ExprPtr parse_math2() {
    ExprPtr l = parse_pow();
    while (peek_op("*") || peek_op("/") || peek_op("//") || peek_op("%")) {
      Token at = next();
      l = binary(at, at.text, std::move(l), parse_pow());
    }
    return l;
  }
  ExprPtr parse_pow() {
    ExprPtr l = parse_unary(true);
    while (peek_op("**")) {
      Token at = next();
      l = binary(at, "**", std::move(l), parse_unary(true));
    }
    return l;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(this, peek().line, peek().col);
    ExprPtr e;
    if (peek_op("-") || peek_op("+")) {
      Token at = next();
      e = node(Expr::Kind::kUnary, at);
      e->name = at.text;
      e->children.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filters(std::move(e));
    return e;
  }

  ExprPtr parse_primary() {
    Token t = next();
    switch (t.kind) {
      case Token::Kind::kName: {
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = node(Expr::Kind::kLiteral, t);
          e->value = Value(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = node(Expr::Kind::kLiteral, t);
          e->value = Value::none();
          return e;
        }
        auto e = node(Expr::Kind::kName, t);
        e->name = t.text;
        return e;
      }
      case Token::Kind::kString: {
        std::string s = t.text;
        while (peek().kind == Token::Kind::kString) s += next().text;  // adjacent literals join
        auto e = node(Expr::Kind::kLiteral, t);
        e->value = Value(std::move(s));
        return e;
      }
      case Token::Kind::kInt: {
        auto e = node(Expr::Kind::kLiteral, t);
        int64_t v = 0;
        for (char c : t.text) {
          if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, c - '0', &v)) {
            fail("integer literal too large", t.line, t.col);
          }
        }
        e->value = Value(v);
        return e;
      }
      case Token::Kind::kFloat: {
        auto e = node(Expr::Kind::kLiteral, t);
        e->value = Value(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case Token::Kind::kOp:
        if (t.text == "(") {
          if (peek_op(")")) {
            next();
            return node(Expr::Kind::kTuple, t);
          }
          ExprPtr e = parse_expression();
          if (peek_op(",")) {
            auto tuple = node(Expr::Kind::kTuple, t);
            tuple->children.push_back(std::move(e));
            while (peek_op(",")) {
              next();
              if (peek_op(")")) break;
              tuple->children.push_back(parse_expression());
            }
            e = std::move(tuple);
          }
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          auto e = node(Expr::Kind::kList, t);
          while (!peek_op("]")) {
            e->children.push_back(parse_expression());
            if (!peek_op(",")) break;
            next();
          }
          expect_op("]");
          return e;
        }
        if (t.text == "{") {
          auto e = node(Expr::Kind::kDict, t);
          while (!peek_op("}")) {
            e->children.push_back(parse_expression());
            expect_op(":");
            e->children.push_back(parse_expression());
            if (!peek_op(",")) break;
            next();
          }
          expect_op("}");
          return e;
        }
        break;
      case Token::Kind::kEnd:
        break;
    }
    fail("unexpected " + describe(t), t.line, t.col);
  }

  ExprPtr parse_postfix(ExprPtr e) {
    while (true) {
      if (peek_op(".")) {
        Token at = next();
        const Token& t = peek();
        if (t.kind != Token::Kind::kName && t.kind != Token::Kind::kInt) {
          fail("expected an attribute name after '.'", t.line, t.col);
        }
        next();
        if (t.kind == Token::Kind::kInt) {
          auto item = node(Expr::Kind::kItem, at);
          item->children.push_back(std::move(e));
          auto idx = node(Expr::Kind::kLiteral, t);
          idx->value = Value(static_cast<int64_t>(std::strtoll(t.text.c_str(), nullptr, 10)));
          item->children.push_back(std::move(idx));
          e = std::move(item);
        } else {
          auto attr = node(Expr::Kind::kAttr, at);
          attr->name = t.text;
          attr->children.push_back(std::move(e));
          e = std::move(attr);
        }
      } else if (peek_op("[")) {
        Token at = next();
        e = parse_subscript(std::move(e), at);
      } else if (peek_op("(")) {
        Token at = next();
        auto call = node(Expr::Kind::kCall, at);
        call->children.push_back(std::move(e));
        parse_call_args(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr target, const Token& at) {
    DepthGuard guard(this, at.line, at.col);
    ExprPtr parts[3];
    bool is_slice = false;
    int part = 0;
    while (true) {
      if (peek_op(":")) {
        next();
        is_slice = true;
        if (++part > 2) fail("too many ':' in a slice", at.line, at.col);
        continue;
      }
      if (peek_op("]")) break;
      if (parts[part]) fail("expected ']' or ':'", peek().line, peek().col);
      parts[part] = parse_expression();
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) fail("empty subscript", at.line, at.col);
      auto item = node(Expr::Kind::kItem, at);
      item->children.push_back(std::move(target));
      item->children.push_back(std::move(parts[0]));
      return item;
    }
    auto slice = node(Expr::Kind::kSlice, at);
    slice->children.push_back(std::move(target));
    for (auto& p : parts) slice->children.push_back(std::move(p));
    return slice;
  }

  // After '(' : positional then keyword arguments, up to and including ')'.
  void parse_call_args(Expr& call) {
    while (!peek_op(")")) {
      if (peek().kind == Token::Kind::kName && peek(1).kind == Token::Kind::kOp && peek(1).text == "=") {
        call.kwarg_names.push_back(next().text);
        next();
        call.children.push_back(parse_expression());
      } else {
        if (!call.kwarg_names.empty())
          fail("positional argument after keyword argument", peek().line, peek().col);
        call.children.push_back(parse_expression());
      }
      if (!peek_op(",")) break;
      next();
    }
    expect_op(")");
  }

  ExprPtr parse_filters(ExprPtr e) {
    while (true) {
      if (peek_op("|")) {
        Token at = next();
        auto f = node(Expr::Kind::kFilter, at);
        f->name = expect(Token::Kind::kName, "a filter name").text;
        while (peek_op(".")) {  // dotted filter names
          next();
          f->name += "." + expect(Token::Kind::kName, "a filter name").text;
        }
        f->children.push_back(std::move(e));
        if (peek_op("(")) {
          next();
          parse_call_args(*f);
        }
        e = std::move(f);
      } else if (peek_name("is")) {
        Token at = next();
        auto t = node(Expr::Kind::kTest, at);
        if (peek_name("not")) {
          next();
          t->negated = true;
        }
        t->name = expect(Token::Kind::kName, "a test name").text;
        t->children.push_back(std::move(e));
        if (peek_op("(")) {
          next();
          parse_call_args(*t);
        } else {
          const Token& n = peek();
          bool starts_arg =
              n.kind == Token::Kind::kString || n.kind == Token::Kind::kInt ||
              n.kind == Token::Kind::kFloat ||
              (n.kind == Token::Kind::kOp && (n.text == "[" || n.text == "{")) ||
              (n.kind == Token::Kind::kName && n.text != "else" && n.text != "or" && n.text != "and" &&
               n.text != "if" && n.text != "is" && n.text != "in" && n.text != "not");
          if (starts_arg) t->children.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(t);
      } else if (peek_op("(")) {
        Token at = next();
        auto call = node(Expr::Kind::kCall, at);
        call->children.push_back(std::move(e));
        parse_call_args(*call);
        e = std::move(call);
      } else {
        return e;
      }
    }
  }

  std::vector<Segment> segs_;
  size_t seg_ = 0;
  std::vector<Token>* toks_ = nullptr;
  size_t tok_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;  // enclosing for loops (break/continue are only valid inside one)
};

}  // namespace

Body parse_template(const std::string& raw) {
  // Jinja2 reads "\r\n" and "\r" as "\n" and drops one trailing newline (keep_trailing_newline off).
  std::string src;
  src.reserve(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) {
    if (raw[i] == '\r') {
      src.push_back('\n');
      if (i + 1 < raw.size() && raw[i + 1] == '\n') ++i;
    } else {
      src.push_back(raw[i]);
    }
  }
  if (!src.empty() && src.back() == '\n') src.pop_back();
  Lexer lexer(src);
  Parser parser(lexer.run());
  return parser.parse();
}

}  // namespace pagoda::jinja
