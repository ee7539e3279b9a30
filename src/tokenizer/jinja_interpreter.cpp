// Tree-walking interpreter of the Jinja subset, with Python/Jinja2 semantics for values
// (Undefined, truthiness, str(), comparisons, negative indices, slices) and the filters,
// tests and methods that real chat templates use. Errors are thrown as RenderError inside
// this file and turned into a Status by chat_template.cpp; every limit in Limits is checked
// so that a hostile template fails instead of hanging, exhausting memory or the stack.
#include <unicase.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "tokenizer/jinja_ast.h"

namespace pagoda::jinja {

namespace {

[[noreturn]] void error_at(const std::string& message, int line, int col) {
  throw RenderError{std::to_string(line) + ":" + std::to_string(col) + ": " + message, false, true};
}
[[noreturn]] void error(const std::string& message) { throw RenderError{message, false}; }
[[noreturn]] void limit_error(const std::string& message) { throw RenderError{message, false, false, true}; }

// ---- text helpers (Python str semantics over UTF-8; invalid bytes count as one char) -------

size_t char_len(std::string_view s, size_t i) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) return 1;
  for (size_t k = 1; k < n; ++k) {
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  }
  return n;
}

std::vector<std::string_view> chars_of(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t n = char_len(s, i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

uint32_t code_point(std::string_view c) {
  unsigned char b0 = static_cast<unsigned char>(c[0]);
  if (c.size() == 1) return b0 < 0x80 ? b0 : 0x110000 + b0;
  uint32_t cp = c.size() == 2 ? (b0 & 0x1F) : c.size() == 3 ? (b0 & 0x0F) : (b0 & 0x07);
  for (size_t k = 1; k < c.size(); ++k) cp = (cp << 6) | (static_cast<unsigned char>(c[k]) & 0x3F);
  return cp;
}

// Python's str.isspace().
bool is_py_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// str.strip / lstrip / rstrip: with `chars` (a Value that may be none/undefined) or whitespace.
std::string py_strip(std::string_view s, const Value* chars, bool left, bool right) {
  std::vector<std::string_view> cs = chars_of(s);
  std::vector<std::string_view> set;
  bool use_set = chars && chars->is_string();
  if (use_set) set = chars_of(chars->str());
  auto strip_it = [&](std::string_view c) {
    if (use_set) return std::find(set.begin(), set.end(), c) != set.end();
    return is_py_space(code_point(c));
  };
  size_t b = 0, e = cs.size();
  if (left)
    while (b < e && strip_it(cs[b])) ++b;
  if (right)
    while (e > b && strip_it(cs[e - 1])) --e;
  if (b == e) return "";
  const char* from = cs[b].data();
  const char* to = cs[e - 1].data() + cs[e - 1].size();
  return std::string(from, to);
}

std::string case_map(const std::string& s, bool upper) {
  size_t n = 0;
  const auto* in = reinterpret_cast<const uint8_t*>(s.data());
  uint8_t* r = upper ? u8_toupper(in, s.size(), nullptr, nullptr, nullptr, &n)
                     : u8_tolower(in, s.size(), nullptr, nullptr, nullptr, &n);
  if (!r) return s;  // invalid UTF-8: leave unchanged
  std::string out(reinterpret_cast<char*>(r), n);
  free(r);
  return out;
}

bool is_letter(std::string_view c) {
  uint32_t cp = code_point(c);
  return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z') ||
         (cp >= 0x80 && cp < 0x110000 && !is_py_space(cp));
}

std::string py_title(const std::string& s, bool only_first) {
  std::string out;
  bool prev_letter = false;
  bool first = true;
  for (std::string_view c : chars_of(s)) {
    std::string ch(c);
    if (only_first) {
      out += case_map(ch, first);
    } else {
      bool letter = is_letter(c);
      out += letter ? case_map(ch, !prev_letter) : ch;
      prev_letter = letter;
    }
    first = false;
  }
  return out;
}

std::string format_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::atoi(sci.c_str() + e + 1);
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits.push_back(c);
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else {
      size_t int_len = static_cast<size_t>(exp) + 1;
      if (digits.size() <= int_len) {
        out += digits + std::string(int_len - digits.size(), '0') + ".0";
      } else {
        out += digits.substr(0, int_len) + "." + digits.substr(int_len);
      }
    }
  } else {
    out += digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof(eb), "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return out;
}

std::string kind_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kNamespace:
      return "Namespace";
    case Value::Kind::kFunction:
      return "function";
  }
  return "?";
}

std::string py_repr(const Value& v, int depth = 0);

// Python's str() as Jinja prints it; Undefined prints as "".
std::string py_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return format_float(v.as_double());
    case Value::Kind::kString:
      return v.str();
    default:
      return py_repr(v);
  }
}

std::string py_repr(const Value& v, int depth) {
  // Deep or self-containing values (a namespace holding itself) must not recurse forever.
  if (depth > 64) error("value nested too deeply to print");
  switch (v.kind()) {
    case Value::Kind::kString: {
      const std::string& s = v.str();
      char q = (s.find('\'') != std::string::npos && s.find('"') == std::string::npos) ? '"' : '\'';
      std::string out(1, q);
      for (char c : s) {
        unsigned char u = static_cast<unsigned char>(c);
        if (c == q || c == '\\') {
          out += '\\';
          out += c;
        } else if (c == '\n') {
          out += "\\n";
        } else if (c == '\r') {
          out += "\\r";
        } else if (c == '\t') {
          out += "\\t";
        } else if (u < 0x20 || u == 0x7F) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\x%02x", u);
          out += b;
        } else {
          out += c;
        }
      }
      return out + q;
    }
    case Value::Kind::kList: {
      std::string out = "[";
      for (size_t i = 0; i < v.list().size(); ++i) out += (i ? ", " : "") + py_repr(v.list()[i], depth + 1);
      return out + "]";
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      std::string out = v.is_namespace() ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, x] : v.dict()) {
        out += (first ? "" : ", ") + py_repr(k, depth + 1) + ": " + py_repr(x, depth + 1);
        first = false;
      }
      return out + (v.is_namespace() ? "}>" : "}");
    }
    case Value::Kind::kFunction:
      return "<function " + v.str() + ">";
    default:
      return py_str(v);
  }
}

void json_string(std::string& out, std::string_view s) {
  out += '"';
  for (char c : s) {
    unsigned char u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (u < 0x20) {
          char b[8];
          std::snprintf(b, sizeof(b), "\\u%04x", u);
          out += b;
        } else {
          out += c;
        }
    }
  }
  out += '"';
}

// Python's json.dumps(v, ensure_ascii=False, indent=indent), as HF's tojson filter calls it.
void to_json(std::string& out, const Value& v, int indent, int level, int depth) {
  if (depth > 64) error("tojson: value nested too deeply");
  auto newline = [&](int lvl) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent) * static_cast<size_t>(lvl), ' ');
  };
  const char* sep = indent < 0 ? ", " : ",";
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d < 0 ? "-Infinity" : "Infinity") : format_float(d);
      return;
    }
    case Value::Kind::kString:
      json_string(out, v.str());
      return;
    case Value::Kind::kList: {
      if (v.list().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list().size(); ++i) {
        if (i) out += sep;
        newline(level + 1);
        to_json(out, v.list()[i], indent, level + 1, depth + 1);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict:
    case Value::Kind::kNamespace: {
      if (v.dict().empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, x] : v.dict()) {
        if (!first) out += sep;
        first = false;
        newline(level + 1);
        if (k.is_string()) {
          json_string(out, k.str());
        } else if (k.is_none()) {
          out += "\"null\"";
        } else if (k.is_bool()) {
          out += k.as_bool() ? "\"true\"" : "\"false\"";
        } else if (k.is_int() || k.is_float()) {
          json_string(out, py_str(k));
        } else {
          error("tojson: keys must be str, int, float, bool or None");
        }
        out += ": ";
        to_json(out, x, indent, level + 1, depth + 1);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      error("tojson: object of type " + kind_name(v) + " is not JSON serializable");
  }
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_double() != 0;
    case Value::Kind::kString:
      return !v.str().empty();
    case Value::Kind::kList:
      return !v.list().empty();
    case Value::Kind::kDict:
      return !v.dict().empty();
    default:
      return true;
  }
}

bool equals(const Value& a, const Value& b, int depth = 0) {
  if (depth > 64) error("comparison nested too deeply");
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!equals(a.list()[i], b.list()[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, x] : a.dict()) {
        const Value* y = b.find(k);
        if (!y || !equals(x, *y, depth + 1)) return false;
      }
      return true;
    }
    default:
      return &a.dict() == &b.dict();
  }
}

// a < b with Python's rules; -1, 0, 1. Unorderable types are an error.
int compare(const Value& a, const Value& b, int depth = 0) {
  if (depth > 64) error("comparison nested too deeply");
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int() ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    int c = a.str().compare(b.str());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_list() && b.is_list()) {
    size_t n = std::min(a.list().size(), b.list().size());
    for (size_t i = 0; i < n; ++i) {
      int c = compare(a.list()[i], b.list()[i], depth + 1);
      if (c) return c;
    }
    return a.list().size() < b.list().size() ? -1 : a.list().size() > b.list().size() ? 1 : 0;
  }
  error("'<' not supported between instances of '" + kind_name(a) + "' and '" + kind_name(b) + "'");
}

// ---- arguments ----

const Value* arg(const CallArgs& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}
Value arg_or(const CallArgs& args, size_t index, const char* name, Value fallback) {
  const Value* v = arg(args, index, name);
  return v ? *v : std::move(fallback);
}
const std::string& string_arg(const CallArgs& args, size_t index, const char* name, const char* what) {
  const Value* v = arg(args, index, name);
  if (!v || !v->is_string()) error(std::string(what) + ": argument '" + name + "' must be a string");
  return v->str();
}

// Python's slice index rules for a sequence of length n.
std::vector<int64_t> slice_indices(int64_t n, const Value& start_v, const Value& stop_v,
                                   const Value& step_v) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) error(std::string("slice ") + what + " must be an integer");
    return v.as_int();
  };
  int64_t step = as_index(step_v, "step").value_or(1);
  if (step == 0) error("slice step cannot be zero");
  std::optional<int64_t> start = as_index(start_v, "start"), stop = as_index(stop_v, "stop");
  auto clamp = [&](int64_t i, bool is_stop) {
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
    (void)is_stop;
  };
  int64_t b = start ? clamp(*start, false) : (step > 0 ? 0 : n - 1);
  int64_t e = stop ? clamp(*stop, true) : (step > 0 ? n : -1);
  std::vector<int64_t> out;
  for (int64_t i = b; step > 0 ? i < e : i > e;) {
    out.push_back(i);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return out;
}

struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  Frame* parent = nullptr;

  Value* find(const std::string& name) {
    for (Frame* f = this; f; f = f->parent) {
      for (auto& [k, v] : f->vars) {
        if (k == name) return &v;
      }
    }
    return nullptr;
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, x] : vars) {
      if (k == name) {
        x = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

enum class Flow { kNormal, kBreak, kContinue };

}  // namespace

const Value* Value::find(const Value& key) const {
  if (!dict_) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (equals(k, key)) return &v;
  }
  return nullptr;
}
const Value* Value::find(const std::string& key) const {
  if (!dict_) return nullptr;
  for (const auto& [k, v] : *dict_) {
    if (k.is_string() && k.str() == key) return &v;
  }
  return nullptr;
}

class Interpreter {
 public:
  Interpreter(const Limits& limits, Frame* root) : limits_(limits), root_(root) {}
  // A namespace can be made to hold itself (`set ns.me = ns`); emptying every namespace at
  // the end breaks such reference cycles so that nothing leaks.
  ~Interpreter() {
    for (const Value& ns : namespaces_) ns.mutable_namespace().clear();
  }
  Interpreter(const Interpreter&) = delete;
  Interpreter& operator=(const Interpreter&) = delete;

  std::string run(const Body& body) {
    exec_body(body, root_);
    return std::move(out_);
  }

  // Charges `bytes` of produced data against the work limit.
  void charge(int64_t bytes) {
    work_ += bytes + 1;
    if (work_ > limits_.max_work) limit_error("template exceeded its work limit");
  }
  // Fails when a string being built grows past the size limit (charged once it is a value).
  void check_size(const std::string& s) const {
    if (static_cast<int64_t>(s.size()) > limits_.max_output_bytes)
      limit_error("string value exceeds the size limit");
  }
  void check_string(const std::string& s) {
    if (static_cast<int64_t>(s.size()) > limits_.max_output_bytes)
      limit_error("string value exceeds the size limit");
    charge(static_cast<int64_t>(s.size()));
  }
  void count_iteration() {
    if (++iterations_ > limits_.max_loop_iterations)
      limit_error("template exceeded its loop iteration limit");
  }

  // ---- statements ----

  Flow exec_body(const Body& body, Frame* frame) {
    for (const StmtPtr& s : body) {
      Flow f = exec(*s, frame);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  void emit(std::string_view text) {
    if (static_cast<int64_t>(out_.size() + text.size()) > limits_.max_output_bytes) {
      limit_error("rendered output exceeds the size limit");
    }
    charge(static_cast<int64_t>(text.size()));
    out_.append(text);
  }

  Flow exec(const Stmt& s, Frame* frame) {
    try {
      return exec_inner(s, frame);
    } catch (RenderError& err) {
      if (!err.raised && !err.located && !err.exhausted) error_at(err.message, s.line, s.col);
      throw;
    }
  }

  Flow exec_inner(const Stmt& s, Frame* frame) {
    DepthGuard guard(this, s.line, s.col);
    switch (s.kind) {
      case Stmt::Kind::kText:
        emit(s.text);
        return Flow::kNormal;
      case Stmt::Kind::kOutput:
        emit(py_str(eval(*s.expr, frame)));
        return Flow::kNormal;
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < s.conditions.size(); ++i) {
          if (truthy(eval(*s.conditions[i], frame))) return exec_body(s.bodies[i], frame);
        }
        if (s.bodies.size() > s.conditions.size()) return exec_body(s.bodies.back(), frame);
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        exec_for(s, frame);
        return Flow::kNormal;
      case Stmt::Kind::kSet:
        exec_set(s, frame);
        return Flow::kNormal;
      case Stmt::Kind::kMacro:
        define_macro(s, frame);
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kBlock:
        return exec_body(s.bodies[0], frame);
    }
    return Flow::kNormal;
  }

  List iterate(const Value& v, int line, int col) {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return {};
      case Value::Kind::kList:
        return v.list();
      case Value::Kind::kDict: {
        List keys;
        for (const auto& [k, x] : v.dict()) keys.push_back(k);
        return keys;
      }
      case Value::Kind::kString: {
        List out;
        for (std::string_view c : chars_of(v.str())) out.emplace_back(std::string(c));
        charge(static_cast<int64_t>(out.size()) * 32);
        return out;
      }
      default:
        error_at("'" + kind_name(v) + "' object is not iterable", line, col);
    }
  }

  void bind_targets(Frame& f, const std::vector<std::string>& targets, const Value& item, int line, int col) {
    if (targets.size() == 1) {
      f.set(targets[0], item);
      return;
    }
    List parts = iterate(item, line, col);
    if (parts.size() != targets.size()) {
      error_at(
          "cannot unpack " + std::to_string(parts.size()) + " values into " + std::to_string(targets.size()),
          line, col);
    }
    for (size_t i = 0; i < targets.size(); ++i) f.set(targets[i], parts[i]);
  }

  void exec_for(const Stmt& s, Frame* frame) {
    List items = iterate(eval(*s.expr, frame), s.line, s.col);
    if (s.condition) {
      List kept;
      Frame probe{{}, frame};
      for (const Value& item : items) {
        count_iteration();
        bind_targets(probe, s.targets, item, s.line, s.col);
        if (truthy(eval(*s.condition, &probe))) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      if (s.bodies.size() > 1) exec_body(s.bodies[1], frame);
      return;
    }
    auto n = static_cast<int64_t>(items.size());
    // Like Jinja2's loop.cycle, one function for the whole loop that follows the current index.
    auto current = std::make_shared<int64_t>(0);
    Value cycle = Value::function("loop.cycle", [current](Interpreter&, CallArgs& a) -> Value {
      if (a.positional.empty()) error("loop.cycle needs at least one argument");
      return a.positional[static_cast<size_t>(*current) % a.positional.size()];
    });
    for (int64_t i = 0; i < n; ++i) {
      count_iteration();
      Frame f{{}, frame};  // Jinja2 starts every iteration with a fresh scope
      bind_targets(f, s.targets, items[static_cast<size_t>(i)], s.line, s.col);
      if (!s.uses_loop) {
        if (exec_body(s.bodies[0], &f) == Flow::kBreak) break;
        continue;
      }
      *current = i;
      Dict loop;
      loop.reserve(12);
      loop.emplace_back("index0", Value(i));
      loop.emplace_back("index", Value(i + 1));
      loop.emplace_back("revindex0", Value(n - i - 1));
      loop.emplace_back("revindex", Value(n - i));
      loop.emplace_back("first", Value(i == 0));
      loop.emplace_back("last", Value(i == n - 1));
      loop.emplace_back("length", Value(n));
      loop.emplace_back("depth", Value(1));
      loop.emplace_back("depth0", Value(0));
      if (i > 0) loop.emplace_back("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < n) loop.emplace_back("nextitem", items[static_cast<size_t>(i + 1)]);
      loop.emplace_back("cycle", cycle);
      f.set("loop", Value(std::move(loop)));
      if (exec_body(s.bodies[0], &f) == Flow::kBreak) break;
    }
  }

  void exec_set(const Stmt& s, Frame* frame) {
    Value v;
    if (s.expr) {
      v = eval(*s.expr, frame);
    } else {
      std::string saved = std::move(out_);
      out_.clear();
      exec_body(s.bodies[0], frame);
      v = Value(std::move(out_));
      out_ = std::move(saved);
    }
    if (!s.text.empty()) {
      Value* ns = frame->find(s.targets[0]);
      if (!ns || !ns->is_namespace()) {
        error_at("cannot assign attribute '" + s.text + "' on '" + s.targets[0] + "' (not a namespace)",
                 s.line, s.col);
      }
      Dict& d = ns->mutable_namespace();
      for (auto& [k, x] : d) {
        if (k.is_string() && k.str() == s.text) {
          x = std::move(v);
          return;
        }
      }
      d.emplace_back(Value(s.text), std::move(v));
      return;
    }
    bind_targets(*frame, s.targets, v, s.line, s.col);
  }

  void define_macro(const Stmt& s, Frame* frame) {
    // A macro sees the template's top-level variables, not those of a loop around its
    // definition: the loop's frame may be gone by the time a stored macro is called.
    const Stmt* macro = &s;
    frame->set(s.text, Value::function(s.text, [macro](Interpreter& in, CallArgs& a) -> Value {
                 return in.call_macro(*macro, in.root_, a);
               }));
  }

  Value call_macro(const Stmt& m, Frame* defining, CallArgs& a) {
    if (++call_depth_ > limits_.max_call_depth) limit_error("macro calls nested too deeply");
    count_iteration();  // macro calls share the loop budget: recursion can fan out
    Frame f{{}, defining};
    if (a.positional.size() > m.targets.size())
      error_at("macro '" + m.text + "' takes " + std::to_string(m.targets.size()) + " arguments", m.line,
               m.col);
    for (size_t i = 0; i < m.targets.size(); ++i) {
      const Value* v = arg(a, i, m.targets[i].c_str());
      if (v) {
        f.set(m.targets[i], *v);
      } else if (m.defaults[i]) {
        f.set(m.targets[i], eval(*m.defaults[i], &f));
      } else {
        f.set(m.targets[i], Value::undefined(m.targets[i]));
      }
    }
    std::string saved = std::move(out_);
    out_.clear();
    exec_body(m.bodies[0], &f);
    Value result(std::move(out_));
    out_ = std::move(saved);
    --call_depth_;
    return result;
  }

  // ---- expressions ----

  struct DepthGuard {
    DepthGuard(Interpreter* in, int line, int col) : in_(in) {
      if (++in_->depth_ > in_->limits_.max_eval_depth) limit_error("template nested too deeply");
      if (++in_->steps_ > in_->limits_.max_steps) limit_error("template exceeded its step limit");
    }
    ~DepthGuard() { --in_->depth_; }
    Interpreter* in_;
  };

  Value eval(const Expr& e, Frame* frame) {
    DepthGuard guard(this, e.line, e.col);
    Value v = eval_inner(e, frame);
    if (v.is_string()) {
      check_string(v.str());
    } else if (v.is_list()) {
      charge(static_cast<int64_t>(v.list().size()) * 16);
    }
    return v;
  }

  CallArgs eval_args(const Expr& e, Frame* frame, size_t first) {
    CallArgs a;
    size_t num_kw = e.kwarg_names.size();
    size_t num_pos = e.children.size() - first - num_kw;
    for (size_t i = 0; i < num_pos; ++i) a.positional.push_back(eval(*e.children[first + i], frame));
    for (size_t i = 0; i < num_kw; ++i) {
      a.keyword.emplace_back(e.kwarg_names[i], eval(*e.children[first + num_pos + i], frame));
    }
    return a;
  }

  Value eval_inner(const Expr& e, Frame* frame) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName: {
        if (Value* v = frame->find(e.name)) return *v;
        if (Value b = builtin(e.name); !b.is_undefined()) return b;
        return Value::undefined("'" + e.name + "' is undefined");
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        List l;
        for (const ExprPtr& c : e.children) l.push_back(eval(*c, frame));
        return Value(std::move(l));
      }
      case Expr::Kind::kDict: {
        Dict d;
        for (size_t i = 0; i + 1 < e.children.size(); i += 2) {
          Value k = eval(*e.children[i], frame);
          Value v = eval(*e.children[i + 1], frame);
          bool replaced = false;
          for (auto& [dk, dv] : d) {
            if (equals(dk, k)) {
              dv = v;
              replaced = true;
            }
          }
          if (!replaced) d.emplace_back(std::move(k), std::move(v));
        }
        return Value(std::move(d));
      }
      case Expr::Kind::kUnary: {
        Value v = eval(*e.children[0], frame);
        if (e.name == "not") return Value(!truthy(v));
        if (!v.is_number())
          error_at("bad operand type for unary " + e.name + ": '" + kind_name(v) + "'", e.line, e.col);
        if (e.name == "+") return v.is_float() ? v : Value(v.as_int());
        if (v.is_float()) return Value(-v.as_double());
        if (v.as_int() == INT64_MIN) error_at("integer overflow", e.line, e.col);
        return Value(-v.as_int());
      }
      case Expr::Kind::kBinary: {
        if (e.name == "and") {
          Value l = eval(*e.children[0], frame);
          return truthy(l) ? eval(*e.children[1], frame) : l;
        }
        if (e.name == "or") {
          Value l = eval(*e.children[0], frame);
          return truthy(l) ? l : eval(*e.children[1], frame);
        }
        Value l = eval(*e.children[0], frame);
        Value r = eval(*e.children[1], frame);
        return binary(e.name, l, r, e.line, e.col);
      }
      case Expr::Kind::kCompare: {
        Value l = eval(*e.children[0], frame);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value r = eval(*e.children[i + 1], frame);
          if (!compare_op(e.ops[i], l, r, e.line, e.col)) return Value(false);
          l = std::move(r);
        }
        return Value(true);
      }
      case Expr::Kind::kCondition: {
        if (truthy(eval(*e.children[1], frame))) return eval(*e.children[0], frame);
        if (e.children.size() > 2) return eval(*e.children[2], frame);
        return Value::undefined("the else branch of a conditional expression");
      }
      case Expr::Kind::kAttr:
        return get_attr(eval(*e.children[0], frame), e.name, e.line, e.col);
      case Expr::Kind::kItem:
        return get_item(eval(*e.children[0], frame), eval(*e.children[1], frame), e.line, e.col);
      case Expr::Kind::kSlice: {
        Value target = eval(*e.children[0], frame);
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.children[static_cast<size_t>(i) + 1])
            parts[i] = eval(*e.children[static_cast<size_t>(i) + 1], frame);
        }
        return slice(target, parts[0], parts[1], parts[2], e.line, e.col);
      }
      case Expr::Kind::kCall: {
        Value f = eval(*e.children[0], frame);
        if (!f.is_function()) {
          if (f.is_undefined())
            error_at(f.str().empty() ? "call of an undefined value" : f.str(), e.line, e.col);
          error_at("'" + kind_name(f) + "' object is not callable", e.line, e.col);
        }
        CallArgs a = eval_args(e, frame, 1);
        try {
          return f.fn()(*this, a);
        } catch (RenderError& err) {
          if (!err.raised && !err.located && !err.exhausted)
            error_at(f.str() + ": " + err.message, e.line, e.col);
          throw;
        }
      }
      case Expr::Kind::kFilter: {
        Value input = eval(*e.children[0], frame);
        CallArgs a = eval_args(e, frame, 1);
        try {
          return filter(e.name, input, a);
        } catch (RenderError& err) {
          if (!err.raised && !err.located && !err.exhausted) error_at(err.message, e.line, e.col);
          throw;
        }
      }
      case Expr::Kind::kTest: {
        Value input = eval(*e.children[0], frame);
        CallArgs a = eval_args(e, frame, 1);
        try {
          bool r = test(e.name, input, a);
          return Value(e.negated ? !r : r);
        } catch (RenderError& err) {
          if (!err.raised && !err.located && !err.exhausted) error_at(err.message, e.line, e.col);
          throw;
        }
      }
    }
    return Value();
  }

  [[noreturn]] static void undefined_error(const Value& v, int line, int col) {
    error_at(v.str().empty() ? "undefined value" : v.str(), line, col);
  }

  Value binary(const std::string& op, const Value& l, const Value& r, int line, int col) {
    if (op == "~") return Value(py_str(l) + py_str(r));
    if (l.is_undefined()) undefined_error(l, line, col);
    if (r.is_undefined()) undefined_error(r, line, col);
    if (op == "+") {
      if (l.is_string() && r.is_string()) return Value(l.str() + r.str());
      if (l.is_list() && r.is_list()) {
        List out = l.list();
        out.insert(out.end(), r.list().begin(), r.list().end());
        return Value(std::move(out));
      }
    }
    if (op == "*" && (l.is_string() || l.is_list() || r.is_string() || r.is_list())) {
      const Value& seq = (l.is_string() || l.is_list()) ? l : r;
      const Value& count = (l.is_string() || l.is_list()) ? r : l;
      if (!count.is_int() && !count.is_bool()) error_at("can't multiply sequence by non-int", line, col);
      int64_t n = std::max<int64_t>(0, count.as_int());
      int64_t unit = seq.is_string() ? static_cast<int64_t>(seq.str().size())
                                     : static_cast<int64_t>(seq.list().size()) * 16;
      if (unit > 0 && n > limits_.max_output_bytes / unit)
        limit_error("sequence repetition exceeds the size limit");
      charge(unit * n);
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.str();
        return Value(std::move(out));
      }
      List out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
      return Value(std::move(out));
    }
    if (!l.is_number() || !r.is_number()) {
      error_at("unsupported operand types for " + op + ": '" + kind_name(l) + "' and '" + kind_name(r) + "'",
               line, col);
    }
    bool use_float = l.is_float() || r.is_float();
    if (op == "/") {
      if (r.as_double() == 0) error_at("division by zero", line, col);
      return Value(l.as_double() / r.as_double());
    }
    if (use_float) {
      double a = l.as_double(), b = r.as_double();
      if (op == "+") return Value(a + b);
      if (op == "-") return Value(a - b);
      if (op == "*") return Value(a * b);
      if (op == "**") return Value(std::pow(a, b));
      if (b == 0) error_at("float division by zero", line, col);
      if (op == "//") return Value(std::floor(a / b));
      if (op == "%") {
        double m = std::fmod(a, b);
        if (m != 0 && ((m < 0) != (b < 0))) m += b;
        return Value(m);
      }
    } else {
      int64_t a = l.as_int(), b = r.as_int(), out = 0;
      if (op == "+" && !__builtin_add_overflow(a, b, &out)) return Value(out);
      if (op == "-" && !__builtin_sub_overflow(a, b, &out)) return Value(out);
      if (op == "*" && !__builtin_mul_overflow(a, b, &out)) return Value(out);
      if (op == "**") {
        if (b < 0) return Value(std::pow(static_cast<double>(a), static_cast<double>(b)));
        int64_t result = 1;
        for (int64_t i = 0; i < b; ++i) {
          if (__builtin_mul_overflow(result, a, &result)) error_at("integer overflow", line, col);
          if (result == 0 || result == 1) break;
          if (result == -1) {
            result = ((b - i - 1) % 2 == 0) ? -1 : 1;
            break;
          }
        }
        return Value(result);
      }
      if (op == "//" || op == "%") {
        if (b == 0) error_at("integer division or modulo by zero", line, col);
        if (a == INT64_MIN && b == -1) error_at("integer overflow", line, col);
        int64_t q = a / b, m = a % b;
        if (m != 0 && ((m < 0) != (b < 0))) {
          q -= 1;
          m += b;
        }
        return Value(op == "//" ? q : m);
      }
      error_at("integer overflow", line, col);
    }
    error_at("unsupported operator " + op, line, col);
  }

  bool contains(const Value& container, const Value& item, int line, int col) {
    switch (container.kind()) {
      case Value::Kind::kUndefined:
        return false;
      case Value::Kind::kString:
        if (!item.is_string()) error_at("'in <string>' requires string as left operand", line, col);
        return container.str().find(item.str()) != std::string::npos;
      case Value::Kind::kList:
        for (const Value& x : container.list()) {
          if (equals(x, item)) return true;
        }
        return false;
      case Value::Kind::kDict:
      case Value::Kind::kNamespace:
        return container.find(item) != nullptr;
      default:
        error_at("argument of type '" + kind_name(container) + "' is not iterable", line, col);
    }
  }

  bool compare_op(const std::string& op, const Value& l, const Value& r, int line, int col) {
    if (op == "==") return equals(l, r);
    if (op == "!=") return !equals(l, r);
    if (op == "in") return contains(r, l, line, col);
    if (op == "not in") return !contains(r, l, line, col);
    try {
      int c = compare(l, r);
      if (op == "<") return c < 0;
      if (op == "<=") return c <= 0;
      if (op == ">") return c > 0;
      return c >= 0;
    } catch (RenderError& err) {
      if (err.located || err.exhausted) throw;
      error_at(err.message, line, col);
    }
  }

  Value slice(const Value& target, const Value& start, const Value& stop, const Value& step, int line,
              int col) {
    try {
      if (target.is_string()) {
        std::vector<std::string_view> cs = chars_of(target.str());
        std::string out;
        for (int64_t i : slice_indices(static_cast<int64_t>(cs.size()), start, stop, step))
          out += cs[static_cast<size_t>(i)];
        return Value(std::move(out));
      }
      if (target.is_list()) {
        List out;
        for (int64_t i : slice_indices(static_cast<int64_t>(target.list().size()), start, stop, step)) {
          out.push_back(target.list()[static_cast<size_t>(i)]);
        }
        return Value(std::move(out));
      }
    } catch (RenderError& err) {
      if (err.located || err.exhausted) throw;
      error_at(err.message, line, col);
    }
    if (target.is_undefined()) undefined_error(target, line, col);
    error_at("'" + kind_name(target) + "' object is not subscriptable", line, col);
  }

  Value get_item(const Value& obj, const Value& key, int line, int col) {
    switch (obj.kind()) {
      case Value::Kind::kUndefined:
        undefined_error(obj, line, col);
      case Value::Kind::kDict:
      case Value::Kind::kNamespace:
        if (const Value* v = obj.find(key)) return *v;
        if (key.is_string()) return get_attr(obj, key.str(), line, col);
        return Value::undefined("no such key in a dict");
      case Value::Kind::kList:
      case Value::Kind::kString: {
        if (key.is_string()) return get_attr(obj, key.str(), line, col);
        if (!key.is_int() && !key.is_bool()) return Value::undefined("bad index");
        int64_t i = key.as_int();
        if (obj.is_list()) {
          auto n = static_cast<int64_t>(obj.list().size());
          if (i < 0) i += n;
          if (i < 0 || i >= n) return Value::undefined("list index out of range");
          return obj.list()[static_cast<size_t>(i)];
        }
        std::vector<std::string_view> cs = chars_of(obj.str());
        auto n = static_cast<int64_t>(cs.size());
        if (i < 0) i += n;
        if (i < 0 || i >= n) return Value::undefined("string index out of range");
        return Value(std::string(cs[static_cast<size_t>(i)]));
      }
      default:
        return Value::undefined("'" + kind_name(obj) + "' object has no item " + py_repr(key));
    }
  }

  Value get_attr(const Value& obj, const std::string& name, int line, int col) {
    if (obj.is_undefined()) undefined_error(obj, line, col);
    if (obj.is_string()) {
      if (Value m = string_method(obj, name); m.is_function()) return m;
    } else if (obj.is_dict()) {
      if (Value m = dict_method(obj, name); m.is_function()) return m;
      if (const Value* v = obj.find(name)) return *v;
    } else if (obj.is_namespace()) {
      if (const Value* v = obj.find(name)) return *v;
    }
    return Value::undefined("'" + kind_name(obj) + " object' has no attribute '" + name + "'");
  }

  // ---- methods ----

  static Value bound(const std::string& name, NativeFunction fn) {
    return Value::function(name, std::move(fn));
  }

  Value string_method(const Value& self, const std::string& name) {
    std::string s = self.str();
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return bound(name, [s, starts](Interpreter&, CallArgs& a) -> Value {
        const Value* p = arg(a, 0, "prefix");
        if (!p) error("missing argument");
        List options = p->is_list() ? p->list() : List{*p};
        for (const Value& o : options) {
          if (!o.is_string()) error("argument must be str or a tuple of str");
          const std::string& x = o.str();
          if (x.size() <= s.size() &&
              (starts ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)) {
            return Value(true);
          }
        }
        return Value(false);
      });
    }
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool left = name != "rstrip", right = name != "lstrip";
      return bound(name, [s, left, right](Interpreter&, CallArgs& a) -> Value {
        return Value(py_strip(s, arg(a, 0, "chars"), left, right));
      });
    }
    if (name == "split" || name == "rsplit") {
      bool from_right = name == "rsplit";
      return bound(name, [s, from_right](Interpreter& in, CallArgs& a) -> Value {
        return in.py_split(s, arg_or(a, 0, "sep", Value::none()), arg_or(a, 1, "maxsplit", Value(-1)),
                           from_right);
      });
    }
    if (name == "replace") {
      return bound(name, [s](Interpreter& in, CallArgs& a) -> Value {
        return Value(in.py_replace(s, string_arg(a, 0, "old", "replace"), string_arg(a, 1, "new", "replace"),
                                   arg_or(a, 2, "count", Value(-1))));
      });
    }
    if (name == "upper" || name == "lower") {
      bool upper = name == "upper";
      return bound(name, [s, upper](Interpreter&, CallArgs&) -> Value { return Value(case_map(s, upper)); });
    }
    if (name == "title" || name == "capitalize") {
      bool first_only = name == "capitalize";
      return bound(name, [s, first_only](Interpreter&, CallArgs&) -> Value {
        return Value(first_only ? py_title(case_map(s, false), true) : py_title(s, false));
      });
    }
    if (name == "find" || name == "count") {
      bool find = name == "find";
      return bound(name, [s, find](Interpreter&, CallArgs& a) -> Value {
        const std::string& sub = string_arg(a, 0, "sub", find ? "find" : "count");
        if (find) {
          size_t at = s.find(sub);
          if (at == std::string::npos) return Value(-1);
          return Value(static_cast<int64_t>(chars_of(std::string_view(s).substr(0, at)).size()));
        }
        if (sub.empty()) return Value(static_cast<int64_t>(chars_of(s).size()) + 1);
        int64_t n = 0;
        for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
        return Value(n);
      });
    }
    if (name == "join") {
      return bound(name, [s](Interpreter& in, CallArgs& a) -> Value {
        const Value* items = arg(a, 0, "iterable");
        if (!items) error("join: missing argument");
        std::string out;
        bool first = true;
        for (const Value& x : in.iterate(*items, 0, 0)) {
          if (!x.is_string()) error("join: sequence item must be str, not " + kind_name(x));
          if (!first) out += s;
          first = false;
          out += x.str();
          in.check_size(out);
        }
        return Value(std::move(out));
      });
    }
    return Value();
  }

  Value dict_method(const Value& self, const std::string& name) {
    if (name == "items" || name == "keys" || name == "values") {
      int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
      return bound(name, [self, which](Interpreter&, CallArgs&) -> Value {
        List out;
        for (const auto& [k, v] : self.dict()) {
          out.push_back(which == 0 ? Value(List{k, v}) : which == 1 ? k : v);
        }
        return Value(std::move(out));
      });
    }
    if (name == "get") {
      return bound(name, [self](Interpreter&, CallArgs& a) -> Value {
        const Value* key = arg(a, 0, "key");
        if (!key) error("get: missing argument");
        if (const Value* v = self.find(*key)) return *v;
        return arg_or(a, 1, "default", Value::none());
      });
    }
    return Value();
  }

  Value py_split(const std::string& s, const Value& sep, const Value& maxsplit_v, bool from_right) {
    if (!maxsplit_v.is_int()) error("split: maxsplit must be an integer");
    int64_t maxsplit = maxsplit_v.as_int();
    List out;
    if (sep.is_none() || sep.is_undefined()) {
      // Runs of whitespace separate; no empty strings.
      std::vector<std::string_view> cs = chars_of(s);
      std::vector<std::pair<size_t, size_t>> words;  // char ranges
      size_t i = 0;
      while (i < cs.size()) {
        while (i < cs.size() && is_py_space(code_point(cs[i]))) ++i;
        if (i >= cs.size()) break;
        size_t b = i;
        while (i < cs.size() && !is_py_space(code_point(cs[i]))) ++i;
        words.emplace_back(b, i);
      }
      auto text = [&](size_t b, size_t e) {
        return std::string(cs[b].data(), cs[e - 1].data() + cs[e - 1].size());
      };
      if (maxsplit < 0 || static_cast<size_t>(maxsplit) >= words.size()) {
        for (auto [b, e] : words) out.emplace_back(text(b, e));
      } else if (!from_right) {
        for (int64_t k = 0; k < maxsplit; ++k)
          out.emplace_back(text(words[static_cast<size_t>(k)].first, words[static_cast<size_t>(k)].second));
        out.emplace_back(text(words[static_cast<size_t>(maxsplit)].first, cs.size()));
      } else {
        size_t keep = words.size() - static_cast<size_t>(maxsplit);
        out.emplace_back(text(0, words[keep - 1].second));
        for (size_t k = keep; k < words.size(); ++k) out.emplace_back(text(words[k].first, words[k].second));
      }
      charge(static_cast<int64_t>(out.size()) * 32);
      return Value(std::move(out));
    }
    if (!sep.is_string()) error("split: separator must be a string or None");
    const std::string& d = sep.str();
    if (d.empty()) error("split: empty separator");
    std::vector<std::string> parts;
    if (!from_right) {
      size_t at = 0;
      while (true) {
        size_t hit = s.find(d, at);
        if (hit == std::string::npos || (maxsplit >= 0 && static_cast<int64_t>(parts.size()) >= maxsplit))
          break;
        parts.push_back(s.substr(at, hit - at));
        at = hit + d.size();
      }
      parts.push_back(s.substr(at));
    } else {
      size_t end = s.size();
      std::vector<std::string> rev;
      while (true) {
        if (maxsplit >= 0 && static_cast<int64_t>(rev.size()) >= maxsplit) break;
        if (end < d.size()) break;
        size_t hit = s.rfind(d, end - d.size());
        if (hit == std::string::npos) break;
        rev.push_back(s.substr(hit + d.size(), end - hit - d.size()));
        end = hit;
      }
      parts.push_back(s.substr(0, end));
      parts.insert(parts.end(), rev.rbegin(), rev.rend());
    }
    charge(static_cast<int64_t>(parts.size()) * 32);
    for (std::string& p : parts) out.emplace_back(std::move(p));
    return Value(std::move(out));
  }

  std::string py_replace(const std::string& s, const std::string& from, const std::string& to,
                         const Value& count_v) {
    int64_t count = count_v.is_int() ? count_v.as_int() : -1;
    std::string out;
    int64_t done = 0;
    if (from.empty()) {
      std::vector<std::string_view> cs = chars_of(s);
      for (size_t i = 0; i <= cs.size(); ++i) {
        if (count < 0 || done < count) {
          out += to;
          ++done;
        }
        if (i < cs.size()) out += cs[i];
        check_size(out);
      }
      return out;
    }
    size_t at = 0;
    while (true) {
      size_t hit = s.find(from, at);
      if (hit == std::string::npos || (count >= 0 && done >= count)) break;
      out.append(s, at, hit - at);
      out += to;
      ++done;
      at = hit + from.size();
      if (static_cast<int64_t>(out.size()) > limits_.max_output_bytes)
        limit_error("string value exceeds the size limit");
    }
    out.append(s, at, std::string::npos);
    return out;
  }

  // ---- built-in functions ----

  Value builtin(const std::string& name) {
    if (name == "raise_exception") {
      return Value::function(name, [](Interpreter&, CallArgs& a) -> Value {
        throw RenderError{a.positional.empty() ? std::string("raise_exception") : py_str(a.positional[0]),
                          true};
      });
    }
    if (name == "range") {
      return Value::function(name, [](Interpreter& in, CallArgs& a) -> Value {
        std::vector<int64_t> p;
        for (const Value& v : a.positional) {
          if (!v.is_int() && !v.is_bool()) error("range: arguments must be integers");
          p.push_back(v.as_int());
        }
        if (p.empty() || p.size() > 3) error("range: expected 1 to 3 arguments");
        int64_t start = p.size() == 1 ? 0 : p[0], stop = p.size() == 1 ? p[0] : p[1],
                step = p.size() == 3 ? p[2] : 1;
        if (step == 0) error("range: step must not be zero");
        List out;
        for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
          if (static_cast<int64_t>(out.size()) >= in.limits_.max_loop_iterations)
            limit_error("range() is too long");
          out.emplace_back(i);
          if (__builtin_add_overflow(i, step, &i)) break;
        }
        in.charge(static_cast<int64_t>(out.size()) * 16);
        return Value(std::move(out));
      });
    }
    if (name == "namespace" || name == "dict") {
      bool is_ns = name == "namespace";
      return Value::function(name, [is_ns](Interpreter& in, CallArgs& a) -> Value {
        Dict d;
        for (const Value& p : a.positional) {
          if (!p.is_dict()) error("expected keyword arguments or a dict");
          for (const auto& kv : p.dict()) d.push_back(kv);
        }
        for (auto& [k, v] : a.keyword) d.emplace_back(Value(k), v);
        if (!is_ns) return Value(std::move(d));
        Value ns = Value::make_namespace(std::move(d));
        in.namespaces_.push_back(ns);
        return ns;
      });
    }
    if (name == "strftime_now") {
      return Value::function(name, [](Interpreter&, CallArgs& a) -> Value {
        if (a.positional.empty() || !a.positional[0].is_string())
          error("strftime_now: expected a format string");
        const std::string& fmt = a.positional[0].str();
        if (fmt.size() > 256) error("strftime_now: format too long");
        std::time_t now = std::time(nullptr);
        std::tm tm{};
        localtime_r(&now, &tm);
        char buf[1024];
        size_t n = std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
        return Value(std::string(buf, n));
      });
    }
    return Value();
  }

  // ---- filters ----

  int64_t length_of(const Value& v) {
    switch (v.kind()) {
      case Value::Kind::kUndefined:
        return 0;
      case Value::Kind::kString:
        return static_cast<int64_t>(chars_of(v.str()).size());
      case Value::Kind::kList:
        return static_cast<int64_t>(v.list().size());
      case Value::Kind::kDict:
      case Value::Kind::kNamespace:
        return static_cast<int64_t>(v.dict().size());
      default:
        error("object of type '" + kind_name(v) + "' has no len()");
    }
  }

  static std::string as_text(const Value& v) { return py_str(v); }

  // The attribute path "a.b" or index of `item`, as the attribute= arguments resolve it.
  Value attribute_of(const Value& item, const Value& attribute) {
    if (attribute.is_int()) return get_item(item, attribute, 0, 0);
    Value cur = item;
    std::string path = py_str(attribute);
    size_t at = 0;
    while (true) {
      size_t dot = path.find('.', at);
      std::string part = path.substr(at, dot == std::string::npos ? std::string::npos : dot - at);
      if (cur.is_undefined()) return cur;
      bool numeric =
          !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
      cur = numeric
                ? get_item(cur, Value(static_cast<int64_t>(std::strtoll(part.c_str(), nullptr, 10))), 0, 0)
                : get_item(cur, Value(part), 0, 0);
      if (dot == std::string::npos) return cur;
      at = dot + 1;
    }
  }

  // One member function a filter, or a family of aliases (first / last, min / max, select /
  // reject / selectattr / rejectattr): a family's function reads the name it was called by.
  using FilterFn = Value (Interpreter::*)(const std::string& name, const Value& v, CallArgs& a);

  // Every filter by each of its names, built once.
  static const std::unordered_map<std::string_view, FilterFn>& filters() {
    static const std::unordered_map<std::string_view, FilterFn> table = {
        {"trim", &Interpreter::filter_trim},
        {"length", &Interpreter::filter_length}, {"count", &Interpreter::filter_length},
        {"upper", &Interpreter::filter_upper},
        {"lower", &Interpreter::filter_lower},
        {"capitalize", &Interpreter::filter_capitalize},
        {"title", &Interpreter::filter_title},
        {"string", &Interpreter::filter_string},
        {"safe", &Interpreter::filter_safe},
        {"e", &Interpreter::filter_escape}, {"escape", &Interpreter::filter_escape},
        {"forceescape", &Interpreter::filter_escape},
        {"tojson", &Interpreter::filter_tojson},
        {"first", &Interpreter::filter_first_last}, {"last", &Interpreter::filter_first_last},
        {"join", &Interpreter::filter_join},
        {"default", &Interpreter::filter_default}, {"d", &Interpreter::filter_default},
        {"replace", &Interpreter::filter_replace},
        {"int", &Interpreter::filter_int},
        {"float", &Interpreter::filter_float},
        {"abs", &Interpreter::filter_abs},
        {"round", &Interpreter::filter_round},
        {"list", &Interpreter::filter_list},
        {"items", &Interpreter::filter_items},
        {"reverse", &Interpreter::filter_reverse},
        {"unique", &Interpreter::filter_unique},
        {"sort", &Interpreter::filter_sort},
        {"min", &Interpreter::filter_min_max}, {"max", &Interpreter::filter_min_max},
        {"sum", &Interpreter::filter_sum},
        {"indent", &Interpreter::filter_indent},
        {"selectattr", &Interpreter::filter_select}, {"rejectattr", &Interpreter::filter_select},
        {"select", &Interpreter::filter_select}, {"reject", &Interpreter::filter_select},
        {"map", &Interpreter::filter_map},
        {"dictsort", &Interpreter::filter_dictsort},
    };
    return table;
  }

  Value filter(const std::string& name, const Value& v, CallArgs& a) {
    const auto& table = filters();
    const auto it = table.find(name);
    if (it == table.end()) error("unknown filter '" + name + "'");
    return (this->*it->second)(name, v, a);
  }

  Value filter_trim(const std::string&, const Value& v, CallArgs& a) {
    return Value(py_strip(as_text(v), arg(a, 0, "chars"), true, true));
  }

  Value filter_length(const std::string&, const Value& v, CallArgs&) { return Value(length_of(v)); }
  Value filter_upper(const std::string&, const Value& v, CallArgs&) { return Value(case_map(as_text(v), true)); }
  Value filter_lower(const std::string&, const Value& v, CallArgs&) { return Value(case_map(as_text(v), false)); }

  Value filter_capitalize(const std::string&, const Value& v, CallArgs&) {
    return Value(py_title(case_map(as_text(v), false), true));
  }

  Value filter_title(const std::string&, const Value& v, CallArgs&) { return Value(py_title(as_text(v), false)); }
  Value filter_string(const std::string&, const Value& v, CallArgs&) { return Value(as_text(v)); }
  Value filter_safe(const std::string&, const Value& v, CallArgs&) { return v; }

  Value filter_escape(const std::string&, const Value& v, CallArgs&) {
    std::string out;
    for (char c : as_text(v)) {
      switch (c) {
        case '&':
          out += "&amp;";
          break;
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '"':
          out += "&#34;";
          break;
        case '\'':
          out += "&#39;";
          break;
        default:
          out += c;
      }
    }
    return Value(std::move(out));
  }

  Value filter_tojson(const std::string&, const Value& v, CallArgs& a) {
    Value indent = arg_or(a, 0, "indent", Value::none());
    if (!indent.is_none() && !indent.is_int()) error("tojson: indent must be an integer");
    std::string out;
    to_json(out, v, indent.is_none() ? -1 : static_cast<int>(std::clamp<int64_t>(indent.as_int(), 0, 16)),
            0, 0);
    return Value(std::move(out));
  }

  Value filter_first_last(const std::string& name, const Value& v, CallArgs&) {
    List items = iterate(v, 0, 0);
    if (items.empty()) return Value::undefined("no " + name + " item of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }

  Value filter_join(const std::string&, const Value& v, CallArgs& a) {
    std::string sep = as_text(arg_or(a, 0, "d", Value("")));
    Value attribute = arg_or(a, 1, "attribute", Value());
    std::string out;
    bool first = true;
    for (const Value& x : iterate(v, 0, 0)) {
      if (!first) out += sep;
      first = false;
      out += as_text(attribute.is_undefined() ? x : attribute_of(x, attribute));
      check_size(out);
    }
    return Value(std::move(out));
  }

  Value filter_default(const std::string&, const Value& v, CallArgs& a) {
    Value fallback = arg_or(a, 0, "default_value", Value(""));
    bool boolean = truthy(arg_or(a, 1, "boolean", Value(false)));
    if (v.is_undefined() || (boolean && !truthy(v))) return fallback;
    return v;
  }

  Value filter_replace(const std::string&, const Value& v, CallArgs& a) {
    Value from = arg_or(a, 0, "old", Value()), to = arg_or(a, 1, "new", Value());
    return Value(py_replace(as_text(v), as_text(from), as_text(to), arg_or(a, 2, "count", Value(-1))));
  }

  Value filter_int(const std::string&, const Value& v, CallArgs& a) {
    Value fallback = arg_or(a, 0, "default", Value(0));
    if (v.is_int() || v.is_bool()) return Value(v.as_int());
    if (v.is_float()) {
      double d = v.as_double();
      if (!std::isfinite(d) || std::fabs(d) >= 9.2e18) return fallback;
      return Value(static_cast<int64_t>(d));
    }
    if (v.is_string()) {
      std::string s = py_strip(v.str(), nullptr, true, true);
      std::string digits;
      for (char c : s)
        if (c != '_') digits.push_back(c);
      int64_t out = 0;
      const char* b = digits.data() + (!digits.empty() && digits[0] == '+' ? 1 : 0);
      auto res = std::from_chars(b, digits.data() + digits.size(), out);
      if (res.ec == std::errc() && res.ptr == digits.data() + digits.size() && !digits.empty())
        return Value(out);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && std::isfinite(d) && std::fabs(d) < 9.2e18) {
        return Value(static_cast<int64_t>(d));
      }
    }
    return fallback;
  }

  Value filter_float(const std::string&, const Value& v, CallArgs& a) {
    Value fallback = arg_or(a, 0, "default", Value(0.0));
    if (v.is_number()) return Value(v.as_double());
    if (v.is_string()) {
      std::string s = py_strip(v.str(), nullptr, true, true);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value(d);
    }
    return fallback;
  }

  Value filter_abs(const std::string&, const Value& v, CallArgs&) {
    if (v.is_float()) return Value(std::fabs(v.as_double()));
    if (v.is_int() || v.is_bool()) {
      if (v.as_int() == INT64_MIN) error("integer overflow");
      return Value(v.as_int() < 0 ? -v.as_int() : v.as_int());
    }
    error("bad operand type for abs()");
  }

  Value filter_round(const std::string&, const Value& v, CallArgs& a) {
    if (!v.is_number()) error("round: expected a number");
    int64_t precision = arg_or(a, 0, "precision", Value(0)).as_int();
    std::string method = as_text(arg_or(a, 1, "method", Value("common")));
    double scale = std::pow(10.0, static_cast<double>(std::clamp<int64_t>(precision, -300, 300)));
    double x = v.as_double() * scale;
    x = method == "ceil" ? std::ceil(x) : method == "floor" ? std::floor(x) : std::nearbyint(x);
    return Value(x / scale);
  }

  Value filter_list(const std::string&, const Value& v, CallArgs&) { return Value(iterate(v, 0, 0)); }

  Value filter_items(const std::string&, const Value& v, CallArgs&) {
    if (v.is_undefined()) return Value(List{});
    if (!v.is_dict()) error("items: expected a mapping");
    List out;
    for (const auto& [k, x] : v.dict()) out.emplace_back(List{k, x});
    return Value(std::move(out));
  }

  Value filter_reverse(const std::string&, const Value& v, CallArgs&) {
    if (v.is_string()) {
      std::vector<std::string_view> cs = chars_of(v.str());
      std::string out;
      for (auto it = cs.rbegin(); it != cs.rend(); ++it) out += *it;
      return Value(std::move(out));
    }
    List items = iterate(v, 0, 0);
    std::reverse(items.begin(), items.end());
    return Value(std::move(items));
  }

  Value filter_unique(const std::string&, const Value& v, CallArgs& a) {
    bool case_sensitive = truthy(arg_or(a, 0, "case_sensitive", Value(false)));
    auto key = [&](const Value& x) {
      return !case_sensitive && x.is_string() ? Value(case_map(x.str(), false)) : x;
    };
    List out, keys;
    for (const Value& x : iterate(v, 0, 0)) {
      Value k = key(x);
      bool seen = false;
      for (const Value& y : keys) {
        count_iteration();
        if (equals(k, y)) seen = true;
      }
      if (!seen) {
        out.push_back(x);
        keys.push_back(std::move(k));
      }
    }
    return Value(std::move(out));
  }

  Value filter_sort(const std::string&, const Value& v, CallArgs& a) {
    List items = iterate(v, 0, 0);
    bool reverse = truthy(arg_or(a, 0, "reverse", Value(false)));
    Value attribute = arg_or(a, 2, "attribute", Value());
    std::vector<std::pair<Value, Value>> keyed;
    for (const Value& x : items) {
      Value key = attribute.is_undefined() ? x : attribute_of(x, attribute);
      if (key.is_string()) key = Value(case_map(key.str(), false));
      keyed.emplace_back(key, x);
    }
    for (size_t i = 0; i < keyed.size(); ++i) count_iteration();
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& x, const auto& y) {
      return reverse ? compare(y.first, x.first) < 0 : compare(x.first, y.first) < 0;
    });
    List out;
    for (auto& kv : keyed) out.push_back(std::move(kv.second));
    return Value(std::move(out));
  }

  Value filter_min_max(const std::string& name, const Value& v, CallArgs&) {
    List items = iterate(v, 0, 0);
    if (items.empty()) return Value::undefined("empty sequence");
    Value best = items[0];
    for (const Value& x : items) {
      int c = compare(x, best);
      if (name == "min" ? c < 0 : c > 0) best = x;
    }
    return best;
  }

  Value filter_sum(const std::string&, const Value& v, CallArgs& a) {
    Value attribute = arg_or(a, 0, "attribute", Value());
    Value total = arg_or(a, 1, "start", Value(0));
    for (const Value& x : iterate(v, 0, 0))
      total = binary("+", total, attribute.is_undefined() ? x : attribute_of(x, attribute), 0, 0);
    return total;
  }

  Value filter_indent(const std::string&, const Value& v, CallArgs& a) {
    int64_t width = arg_or(a, 0, "width", Value(4)).as_int();
    bool first = truthy(arg_or(a, 1, "first", Value(false)));
    bool blank = truthy(arg_or(a, 2, "blank", Value(false)));
    std::string pad(static_cast<size_t>(std::clamp<int64_t>(width, 0, 256)), ' ');
    std::string s = as_text(v), out;
    size_t at = 0;
    bool first_line = true;
    while (true) {
      size_t nl = s.find('\n', at);
      std::string line = s.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
      bool pad_it = first_line ? first : (blank || !line.empty());
      if (pad_it && !(first_line && line.empty() && !blank && !first)) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += '\n';
      at = nl + 1;
      first_line = false;
      check_size(out);
    }
    return Value(std::move(out));
  }

  Value filter_select(const std::string& name, const Value& v, CallArgs& a) {
    bool by_attr = name == "selectattr" || name == "rejectattr";
    bool keep_if = name == "selectattr" || name == "select";
    size_t at = 0;
    Value attribute;
    if (by_attr) {
      if (a.positional.empty()) error(name + ": missing attribute name");
      attribute = a.positional[at++];
    }
    std::string test_name = at < a.positional.size() ? as_text(a.positional[at++]) : "";
    CallArgs test_args;
    test_args.positional.assign(
        a.positional.begin() + static_cast<std::ptrdiff_t>(std::min(at, a.positional.size())),
        a.positional.end());
    List out;
    for (const Value& x : iterate(v, 0, 0)) {
      count_iteration();
      Value subject = by_attr ? attribute_of(x, attribute) : x;
      bool ok = test_name.empty() ? truthy(subject) : test(test_name, subject, test_args);
      if (ok == keep_if) out.push_back(x);
    }
    return Value(std::move(out));
  }

  Value filter_map(const std::string&, const Value& v, CallArgs& a) {
    List out;
    Value attribute = arg_or(a, 99, "attribute", Value());
    if (!attribute.is_undefined()) {
      Value fallback = arg_or(a, 99, "default", Value());
      for (const Value& x : iterate(v, 0, 0)) {
        count_iteration();
        Value y = attribute_of(x, attribute);
        out.push_back(y.is_undefined() && !fallback.is_undefined() ? fallback : y);
      }
      return Value(std::move(out));
    }
    if (a.positional.empty()) error("map: expected a filter name or attribute=");
    std::string inner = as_text(a.positional[0]);
    CallArgs inner_args;
    inner_args.positional.assign(a.positional.begin() + 1, a.positional.end());
    inner_args.keyword = a.keyword;
    for (const Value& x : iterate(v, 0, 0)) {
      count_iteration();
      out.push_back(filter(inner, x, inner_args));
    }
    return Value(std::move(out));
  }

  Value filter_dictsort(const std::string&, const Value& v, CallArgs& a) {
    if (!v.is_dict()) error("dictsort: expected a mapping");
    List items;
    for (const auto& [k, x] : v.dict()) items.emplace_back(List{k, x});
    bool by_value = as_text(arg_or(a, 1, "by", Value("key"))) == "value";
    bool reverse = truthy(arg_or(a, 2, "reverse", Value(false)));
    std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
      Value kx = x.list()[by_value ? 1 : 0], ky = y.list()[by_value ? 1 : 0];
      if (kx.is_string()) kx = Value(case_map(kx.str(), false));
      if (ky.is_string()) ky = Value(case_map(ky.str(), false));
      return reverse ? compare(ky, kx) < 0 : compare(kx, ky) < 0;
    });
    return Value(std::move(items));
  }

  // ---- tests ----

  bool test(const std::string& name, const Value& v, const CallArgs& a) {
    auto other = [&]() -> const Value& {
      if (a.positional.empty()) error("test '" + name + "' needs an argument");
      return a.positional[0];
    };
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "mapping") return v.is_dict();
    if (name == "iterable") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    if (name == "sequence") return v.is_string() || v.is_list() || v.is_dict() || v.is_undefined();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.is_int();
    if (name == "float") return v.is_float();
    if (name == "boolean") return v.is_bool();
    if (name == "true") return v.is_bool() && v.as_bool();
    if (name == "false") return v.is_bool() && !v.as_bool();
    if (name == "callable") return v.is_function();
    if (name == "lower") return v.is_string() && case_map(v.str(), false) == v.str();
    if (name == "upper") return v.is_string() && case_map(v.str(), true) == v.str();
    if (name == "odd" || name == "even") {
      if (!v.is_int() && !v.is_bool()) error("test '" + name + "' needs an integer");
      return (v.as_int() % 2 != 0) == (name == "odd");
    }
    if (name == "divisibleby") {
      const Value& d = other();
      if (!v.is_int() || !d.is_int() || d.as_int() == 0) error("divisibleby needs non-zero integers");
      if (d.as_int() == -1) return true;
      return v.as_int() % d.as_int() == 0;
    }
    if (name == "eq" || name == "equalto" || name == "==") return equals(v, other());
    if (name == "ne" || name == "!=") return !equals(v, other());
    if (name == "sameas") {
      const Value& o = other();
      // Identity: None, booleans and (small, interned) integers are the same object when equal.
      if (v.is_none() || v.is_bool() || v.is_int()) return v.kind() == o.kind() && v.as_int() == o.as_int();
      return false;
    }
    if (name == "lt" || name == "lessthan" || name == "<") return compare(v, other()) < 0;
    if (name == "le" || name == "<=") return compare(v, other()) <= 0;
    if (name == "gt" || name == "greaterthan" || name == ">") return compare(v, other()) > 0;
    if (name == "ge" || name == ">=") return compare(v, other()) >= 0;
    if (name == "in") return contains(other(), v, 0, 0);
    error("unknown test '" + name + "'");
  }

 private:
  const Limits& limits_;
  Frame* root_;
  std::string out_;
  int64_t work_ = 0;
  int64_t iterations_ = 0;
  int64_t steps_ = 0;
  std::vector<Value> namespaces_;  // every namespace() made by this render
  int depth_ = 0;
  int call_depth_ = 0;
};

std::string render_template(const Body& body, const std::vector<std::pair<std::string, Value>>& globals,
                            const Limits& limits) {
  Frame root;
  root.vars = globals;
  Interpreter interpreter(limits, &root);
  return interpreter.run(body);
}

}  // namespace pagoda::jinja
