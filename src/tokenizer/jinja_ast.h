// Internal to chat templates: the values and syntax tree of the Jinja subset that
// chat_template.cpp interprets (see chat_template.h for the supported language).
//
// Values follow Python's semantics as Jinja2 sees them (None, bool, int, float, str, list,
// dict, plus Jinja's Undefined). Lists and dicts are shared and never mutated after they are
// built, except a namespace() object, whose attributes `set ns.x = ...` assigns. Trees are
// immutable after parsing, so a parsed template can be rendered from many threads at once.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace pagoda::jinja {

class Value;
class Interpreter;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<Value, Value>>;  // insertion-ordered, like Python's dict

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};
using NativeFunction = std::function<Value(Interpreter&, CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kNamespace, kFunction };

  Value() = default;  // undefined
  static Value none() {
    Value v;
    v.kind_ = Kind::kNone;
    return v;
  }
  // An undefined value that remembers what was looked up, for error messages.
  static Value undefined(std::string hint) {
    Value v;
    v.str_ = std::move(hint);
    return v;
  }
  Value(bool b) : kind_(Kind::kBool), int_(b ? 1 : 0) {}                                    // NOLINT
  Value(int64_t i) : kind_(Kind::kInt), int_(i) {}                                          // NOLINT
  Value(int i) : kind_(Kind::kInt), int_(i) {}                                              // NOLINT
  Value(double d) : kind_(Kind::kFloat), float_(d) {}                                       // NOLINT
  Value(std::string s) : kind_(Kind::kString), str_(std::move(s)) {}                        // NOLINT
  Value(const char* s) : kind_(Kind::kString), str_(s) {}                                   // NOLINT
  Value(List l) : kind_(Kind::kList), list_(std::make_shared<const List>(std::move(l))) {}  // NOLINT
  Value(Dict d) : kind_(Kind::kDict), dict_(std::make_shared<Dict>(std::move(d))) {}        // NOLINT
  static Value make_namespace(Dict d) {
    Value v(std::move(d));
    v.kind_ = Kind::kNamespace;
    return v;
  }
  static Value function(std::string name, NativeFunction fn) {
    Value v;
    v.kind_ = Kind::kFunction;
    v.str_ = std::move(name);
    v.fn_ = std::make_shared<const NativeFunction>(std::move(fn));
    return v;
  }

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const { return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool; }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool as_bool() const { return int_ != 0; }
  int64_t as_int() const { return int_; }  // also for bool
  double as_double() const { return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_); }
  const std::string& str() const { return str_; }  // string, a function's name, an undefined's hint
  const List& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }  // dict or namespace
  Dict& mutable_namespace() const { return *dict_; }
  const NativeFunction& fn() const { return *fn_; }

  // The value stored under `key` (a dict or namespace), or nullptr.
  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;

 private:
  Kind kind_ = Kind::kUndefined;
  int64_t int_ = 0;
  double float_ = 0;
  std::string str_;
  std::shared_ptr<const List> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const NativeFunction> fn_;
};

// ---- syntax tree ---------------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // children
    kTuple,      // children
    kDict,       // children: key, value, key, value...
    kUnary,      // op ("-", "+", "not"), children[0]
    kBinary,     // op, children[0..1]; "and"/"or" short-circuit
    kCompare,    // ops[i] between children[i] and children[i+1] (chained like Python)
    kCondition,  // children: then, condition, [else]
    kAttr,       // children[0].name
    kItem,       // children[0][children[1]]
    kSlice,      // children[0][c1:c2:c3]; absent parts are null children
    kCall,       // children[0](children[1..]; kwarg_names for the trailing keyword ones)
    kFilter,     // name; children[0] | name(children[1..])
    kTest,       // name; children[0] is [not] name(children[1..]); negated
  };
  Kind kind;
  int line = 0, col = 0;
  std::string name;  // name, attribute, operator, filter or test
  std::vector<std::string> ops;
  std::vector<ExprPtr> children;
  std::vector<std::string> kwarg_names;  // names of the last kwarg_names.size() arguments
  bool negated = false;
  Value value;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kIf,      // conditions[i] -> bodies[i]; a trailing extra body is the else branch
    kFor,     // targets in expr [if condition]: bodies[0], else bodies[1]
    kSet,     // targets (one name, or "ns" + attr) = expr; or with block body bodies[0]
    kMacro,   // name(params = defaults): bodies[0]
    kBreak,
    kContinue,
    kBlock,  // a body rendered in place ({% generation %})
  };
  Kind kind;
  int line = 0, col = 0;
  std::string text;                 // text, macro name, or set attribute
  ExprPtr expr;                     // output / for iterable / set value
  ExprPtr condition;                // for ... if condition
  std::vector<ExprPtr> conditions;  // if / elif
  std::vector<Body> bodies;
  std::vector<std::string> targets;  // for / set names, macro parameters
  std::vector<ExprPtr> defaults;     // macro parameter defaults (null where none)
  bool uses_loop = true;             // for: the body may read `loop` (else it is not built)
};

// Parses template source. Throws ParseError with line and column on a syntax error.
struct ParseError {
  std::string message;
  int line, col;
};
Body parse_template(const std::string& source);

// What one render may spend; exceeding any of them fails the render.
struct Limits {
  int64_t max_output_bytes = 1 << 20;     // the rendered text, and any one string value
  int64_t max_loop_iterations = 1000000;  // over all loops together
  int max_call_depth = 64;                // nested macro calls
  int max_eval_depth = 1500;              // nested statements and expressions (stack)
  int64_t max_work = int64_t{1} << 28;    // bytes of strings and list items produced
  int64_t max_steps = 10000000;           // statements and expressions evaluated
};

// A failure while rendering. `raised` is set for raise_exception(message), whose message is
// the template author's text; other messages name the problem and its line:col.
struct RenderError {
  std::string message;
  bool raised = false;
  bool located = false;    // the message already starts with line:col
  bool exhausted = false;  // a limit of Limits was hit
};

// Renders `body` with the template-level variables `globals` (plus the built-in functions
// range, namespace, raise_exception, strftime_now, dict). Throws RenderError.
std::string render_template(const Body& body, const std::vector<std::pair<std::string, Value>>& globals,
                            const Limits& limits);

}  // namespace pagoda::jinja
