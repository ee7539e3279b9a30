#include "structured/json_schema.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "structured/regex_grammar.h"

namespace pagoda::structured {
namespace {

using json = nlohmann::ordered_json;

constexpr int kMaxDepth = 64;           // schemas inside schemas (the compiler recurses on them)
constexpr size_t kMaxLiterals = 4096;   // values of one enum or choice list
constexpr size_t kMaxBoundDigits = 30;  // digits of a numeric bound
constexpr size_t kMaxExceptKey = 1024;  // bytes of a property name that other keys must differ from
constexpr int64_t kMaxWhitespace = 32;  // bytes of whitespace between two tokens (json_schema.h)
// Digits of a number's whole part, and of its exponent: parsers read JSON numbers as doubles, where
// 1e999 or 400 digits are infinity (json_schema.h).
constexpr int64_t kMaxWholeDigits = 32;

bool is_annotation(const std::string& key) {
  static const std::set<std::string> kAnnotations = {
      "title",      "description", "default", "examples", "$schema",     "$id",
      "$comment",   "deprecated",  "readOnly", "writeOnly", "$defs", "definitions"};
  return kAnnotations.count(key) > 0 || key.rfind("x-", 0) == 0;
}

// The keywords each type takes, and those that apply whatever the type.
const std::map<std::string, std::set<std::string>>& type_keywords() {
  static const std::map<std::string, std::set<std::string>> kByType = {
      {"object", {"properties", "required", "additionalProperties"}},
      {"array", {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"}},
      {"string", {"minLength", "maxLength", "pattern", "format"}},
      {"number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
      {"integer", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}},
      {"boolean", {}},
      {"null", {}},
  };
  return kByType;
}

bool is_general_keyword(const std::string& key) {
  return key == "type" || key == "enum" || key == "const" || key == "anyOf" || key == "oneOf" || key == "allOf" ||
         key == "$ref";
}

// JSON pointer tokens (RFC 6901): "~1" is '/', "~0" is '~'.
std::string unescape_pointer_token(const std::string& t) {
  std::string out;
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == '~' && i + 1 < t.size() && (t[i + 1] == '0' || t[i + 1] == '1')) {
      out += t[i + 1] == '0' ? '~' : '/';
      ++i;
    } else {
      out += t[i];
    }
  }
  return out;
}

// Decimal magnitudes as digit strings without leading zeros ("0" for zero).
int compare_magnitudes(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a < b ? -1 : (a > b ? 1 : 0);
}

std::string add_one(std::string s) {
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '9') {
      ++s[i];
      return s;
    }
    s[i] = '0';
  }
  return "1" + s;
}

std::string subtract_one(std::string s) {  // s > 0
  for (size_t i = s.size(); i-- > 0;) {
    if (s[i] != '0') {
      --s[i];
      break;
    }
    s[i] = '9';
  }
  const size_t nz = s.find_first_not_of('0');
  return nz == std::string::npos ? "0" : s.substr(nz);
}

// A bound on a number: value = (negative ? -1 : 1) * magnitude, open when exclusive.
struct Bound {
  bool negative = false;
  std::string magnitude;  // digits
  bool open = false;
};

// Whole numbers as signed digit strings, to compare and step.
struct Whole {
  bool negative = false;
  std::string magnitude;
};

int compare_wholes(const Whole& a, const Whole& b) {
  const bool an = a.negative && a.magnitude != "0", bn = b.negative && b.magnitude != "0";
  if (an != bn) return an ? -1 : 1;
  const int c = compare_magnitudes(a.magnitude, b.magnitude);
  return an ? -c : c;
}

Whole step(const Whole& w, int by) {  // w + by, by = +1 or -1
  const bool negative = w.negative && w.magnitude != "0";
  if ((by > 0) != negative) return {negative, add_one(w.magnitude)};
  if (w.magnitude == "0") return {by < 0, "1"};
  const std::string m = subtract_one(w.magnitude);
  return {negative && m != "0", m};
}

class SchemaCompiler {
 public:
  SchemaCompiler(const json& root, const JsonSchemaOptions& options) : root_(root), options_(options) {}

  Result<Grammar> compile() {
    const int32_t top = b_.rule("root");
    const Element v = value(root_, "#", 0);
    if (!error_.empty()) return invalid_argument(error_);
    b_.add_alternative(top, {v});
    Result<Grammar> g = std::move(b_).build(top);
    if (!g.ok()) return invalid_argument("JSON schema: " + g.status().message());
    return g;
  }

  Result<Grammar> choices(const std::vector<std::string>& texts) {
    const int32_t top = b_.rule("root");
    const Element v = literal_set(texts, "choice", "choice");
    if (!error_.empty()) return invalid_argument(error_);
    b_.add_alternative(top, {v});
    return std::move(b_).build(top);
  }

  Grammar object_only() {
    const int32_t top = b_.rule("root");
    b_.add_alternative(top, {any_object()});
    Result<Grammar> g = std::move(b_).build(top);
    return std::move(g).value();
  }

 private:
  // Records the first error; the element returned stands in so that compiling can unwind.
  Element fail(const std::string& path, const std::string& what) {
    if (error_.empty()) error_ = path == "choice" ? "choice: " + what : "JSON schema: at " + path + ": " + what;
    return b_.byte('?');
  }

  void add_ws(Alternative& alt) {
    if (options_.any_whitespace) alt.push_back(ws());
  }

  Element ws() {
    if (ws_ < 0) {
      ws_ = b_.rule("ws");
      ByteSet space;
      for (char c : {' ', '\t', '\n', '\r'}) space.add(static_cast<uint8_t>(c));
      b_.add_alternative(ws_, {b_.repeat({b_.bytes(space)}, 0, kMaxWhitespace, "ws")});
    }
    return GrammarBuilder::ref(ws_);
  }

  Element rule_of(std::vector<Alternative> alternatives, const std::string& hint) {
    const int32_t r = b_.fresh_rule(hint);
    for (Alternative& alt : alternatives) b_.add_alternative(r, std::move(alt));
    return GrammarBuilder::ref(r);
  }

  static void append(Alternative& to, const Alternative& more) { to.insert(to.end(), more.begin(), more.end()); }

  // --- Any JSON value, in every spelling JSON allows. ---

  Element any_value() {
    if (value_ < 0) {
      value_ = b_.rule("value");
      b_.add_alternative(value_, {any_object()});
      b_.add_alternative(value_, {any_array()});
      b_.add_alternative(value_, {any_string()});
      b_.add_alternative(value_, {any_number()});
      for (const char* word : {"true", "false", "null"}) b_.add_alternative(value_, b_.literal(word));
    }
    return GrammarBuilder::ref(value_);
  }

  // "{" ws "}" | "{" ws member (ws "," ws member)* ws "}", member = string ws ":" ws value.
  Element any_object() {
    if (object_ < 0) {
      object_ = b_.rule("object");
      Alternative member{any_string()};
      add_ws(member);
      member.push_back(b_.byte(':'));
      add_ws(member);
      member.push_back(any_value());
      b_.add_alternative(object_, wrapped('{', {}, '}'));
      b_.add_alternative(object_, wrapped('{', list_of(member, 1, -1, "object-members"), '}'));
    }
    return GrammarBuilder::ref(object_);
  }

  Element any_array() {
    if (array_ < 0) {
      array_ = b_.rule("array");
      b_.add_alternative(array_, wrapped('[', {}, ']'));
      b_.add_alternative(array_, wrapped('[', list_of({any_value()}, 1, -1, "array-items"), ']'));
    }
    return GrammarBuilder::ref(array_);
  }

  // open ws inside ws close (inside empty: open ws close).
  Alternative wrapped(char open, const Alternative& inside, char close) {
    Alternative alt{b_.byte(static_cast<uint8_t>(open))};
    add_ws(alt);
    if (!inside.empty()) {
      append(alt, inside);
      add_ws(alt);
    }
    alt.push_back(b_.byte(static_cast<uint8_t>(close)));
    return alt;
  }

  // item (ws "," ws item){min-1, max-1}, for min >= 1.
  Alternative list_of(const Alternative& item, int64_t min, int64_t max, const std::string& hint) {
    Alternative more;
    add_ws(more);
    more.push_back(b_.byte(','));
    add_ws(more);
    append(more, item);
    Alternative alt = item;
    alt.push_back(b_.repeat(more, min - 1, max < 0 ? -1 : max - 1, hint));
    return alt;
  }

  // One character of a string, in any of JSON's spellings.
  Element json_char() {
    if (char_ < 0) {
      char_ = b_.rule("char");
      b_.add_alternative(char_, {b_.code_points({{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}}, "char-raw")});
      ByteSet escaped;
      for (char c : std::string("\"\\/bfnrt")) escaped.add(static_cast<uint8_t>(c));
      b_.add_alternative(char_, {b_.byte('\\'), b_.bytes(escaped)});
      // \uXXXX: a code point outside the surrogates, or a high surrogate's escape followed by a
      // low one's (one character, as JSON Schema counts them); a lone surrogate is no character.
      const Element h = hex_digit(), u = b_.byte('u'), slash = b_.byte('\\');
      ByteSet d, not_d, high, low, below_d8;
      d.add('D');
      d.add('d');
      not_d.add_range('0', '9');
      not_d.add_range('a', 'c');
      not_d.add_range('e', 'f');
      not_d.add_range('A', 'C');
      not_d.add_range('E', 'F');
      for (char c : std::string("89abAB")) high.add(static_cast<uint8_t>(c));
      for (char c : std::string("cdefCDEF")) low.add(static_cast<uint8_t>(c));
      below_d8.add_range('0', '7');
      b_.add_alternative(char_, {slash, u, b_.bytes(not_d), h, h, h});
      b_.add_alternative(char_, {slash, u, b_.bytes(d), b_.bytes(below_d8), h, h});
      b_.add_alternative(char_, {slash, u, b_.bytes(d), b_.bytes(high), h, h, slash, u, b_.bytes(d), b_.bytes(low), h, h});
    }
    return GrammarBuilder::ref(char_);
  }

  Element hex_digit() {
    ByteSet hex;
    hex.add_range('0', '9');
    hex.add_range('a', 'f');
    hex.add_range('A', 'F');
    return b_.bytes(hex);
  }

  Element any_string() {
    if (string_ < 0) {
      string_ = b_.rule("string");
      b_.add_alternative(string_, {b_.byte('"'), b_.repeat({json_char()}, 0, -1, "chars"), b_.byte('"')});
    }
    return GrammarBuilder::ref(string_);
  }

  Element any_number() {
    if (number_ < 0) {
      number_ = b_.rule("number");
      Alternative alt;
      alt.push_back(b_.repeat({b_.byte('-')}, 0, 1, "sign"));
      alt.push_back(natural());
      Alternative fraction{b_.byte('.'), digits(1, -1)};
      alt.push_back(b_.repeat(fraction, 0, 1, "fraction"));
      ByteSet e, sign;
      e.add('e');
      e.add('E');
      sign.add('+');
      sign.add('-');
      Alternative exponent{b_.bytes(e), b_.repeat({b_.bytes(sign)}, 0, 1, "exponent-sign"), digits(1, 2)};
      alt.push_back(b_.repeat(exponent, 0, 1, "exponent"));
      b_.add_alternative(number_, std::move(alt));
    }
    return GrammarBuilder::ref(number_);
  }

  Element digit(char lo = '0', char hi = '9') {
    ByteSet set;
    set.add_range(static_cast<uint8_t>(lo), static_cast<uint8_t>(hi));
    return b_.bytes(set);
  }

  Element digits(int64_t min, int64_t max) { return b_.repeat({digit()}, min, max, "digits"); }

  // 0 | [1-9][0-9]*
  Element natural() {
    if (natural_ < 0) {
      natural_ = b_.rule("natural");
      b_.add_alternative(natural_, {b_.byte('0')});
      b_.add_alternative(natural_, {digit('1', '9'), digits(0, kMaxWholeDigits - 1)});
    }
    return GrammarBuilder::ref(natural_);
  }

  // --- Schemas. ---

  Element value(const json& schema, const std::string& path, int depth) {
    if (depth > kMaxDepth) return fail(path, "schemas nest deeper than " + std::to_string(kMaxDepth));
    if (schema.is_boolean()) {
      if (schema.get<bool>()) return any_value();
      return fail(path, "the schema false matches nothing");
    }
    if (!schema.is_object()) return fail(path, "a schema must be an object or a boolean");
    std::vector<std::string> constraints;  // the keys that are not annotations
    for (auto it = schema.begin(); it != schema.end(); ++it) {
      const std::string& key = it.key();
      if (is_annotation(key)) continue;
      bool known = is_general_keyword(key);
      for (const auto& [type, keys] : type_keywords()) known = known || keys.count(key) > 0;
      if (!known) return fail(path, "'" + key + "' is not supported");
      constraints.push_back(key);
    }
    if (constraints.empty()) return any_value();
    auto only = [&](const std::string& key, std::initializer_list<const char*> allowed) -> bool {
      for (const std::string& k : constraints) {
        if (k == key) continue;
        if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return k == a; })) {
          fail(path, "'" + k + "' beside '" + key + "' is not supported");
          return false;
        }
      }
      return true;
    };
    if (schema.contains("$ref")) {
      if (!only("$ref", {})) return b_.byte('?');
      return reference(schema["$ref"], path, depth);
    }
    if (schema.contains("allOf")) {
      const json& all = schema["allOf"];
      if (!all.is_array() || all.empty()) return fail(path, "'allOf' must be a non-empty array");
      if (all.size() > 1) return fail(path, "'allOf' with more than one schema is not supported");
      if (!only("allOf", {})) return b_.byte('?');
      return value(all[0], path + "/allOf/0", depth + 1);
    }
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!schema.contains(key)) continue;
      const json& any = schema[key];
      if (!any.is_array() || any.empty()) return fail(path, std::string("'") + key + "' must be a non-empty array");
      if (!only(key, {})) return b_.byte('?');
      std::vector<Alternative> alts;
      for (size_t i = 0; i < any.size(); ++i) {
        alts.push_back({value(any[i], path + "/" + key + "/" + std::to_string(i), depth + 1)});
      }
      return rule_of(std::move(alts), "any-of");
    }
    const std::vector<std::string> types = types_of(schema, path);
    if (!error_.empty()) return b_.byte('?');
    for (const char* key : {"enum", "const"}) {
      if (!schema.contains(key)) continue;
      if (!only(key, {"type"})) return b_.byte('?');
      json values = schema[key];
      if (std::string(key) == "const") values = json::array({values});
      if (!values.is_array() || values.empty()) return fail(path, "'enum' must be a non-empty array");
      std::vector<std::string> texts;
      for (const json& v : values) {
        if (schema.contains("type") && !has_type(types, v)) continue;
        try {
          texts.push_back(v.dump());
        } catch (const json::exception&) {
          return fail(path, std::string("a value of '") + key + "' is not valid UTF-8");
        }
      }
      if (texts.empty()) return fail(path, std::string("no value of '") + key + "' has the schema's type");
      return literal_set(texts, path, "enum");
    }
    // Every type-specific keyword must apply to one of the types.
    for (const std::string& k : constraints) {
      if (is_general_keyword(k)) continue;
      const bool applies = std::any_of(types.begin(), types.end(),
                                       [&](const std::string& t) { return type_keywords().at(t).count(k) > 0; });
      if (!applies) return fail(path, "'" + k + "' does not apply to the schema's type");
    }
    std::vector<Alternative> alts;
    const bool number = std::find(types.begin(), types.end(), "number") != types.end();
    for (const std::string& t : types) {
      if (t == "integer" && number) continue;  // (every integer is a number)
      alts.push_back({typed_value(t, schema, path, depth)});
    }
    if (alts.size() == 1 && alts[0].size() == 1) return alts[0][0];
    return rule_of(std::move(alts), "types");
  }

  // The schema's types: "type" (a name or a list), else what its keywords imply, else all.
  std::vector<std::string> types_of(const json& schema, const std::string& path) {
    std::vector<std::string> types;
    if (schema.contains("type")) {
      const json& t = schema["type"];
      const json list = t.is_array() ? t : json::array({t});
      if (list.empty()) fail(path, "'type' must not be an empty list");
      for (const json& name : list) {
        if (!name.is_string() || !type_keywords().count(name.get<std::string>())) {
          fail(path, "'type' " + name.dump() + " is not a JSON Schema type");
          return {};
        }
        types.push_back(name.get<std::string>());
      }
      return types;
    }
    for (const auto& [type, keys] : type_keywords()) {
      if (type == "integer") continue;
      for (const std::string& k : keys) {
        if (schema.contains(k)) {
          types.push_back(type);
          break;
        }
      }
    }
    if (types.empty()) {
      for (const auto& [type, keys] : type_keywords()) {
        if (type != "integer") types.push_back(type);
      }
    }
    return types;
  }

  static bool has_type(const std::vector<std::string>& types, const json& v) {
    auto is = [&](const char* t) { return std::find(types.begin(), types.end(), t) != types.end(); };
    switch (v.type()) {
      case json::value_t::object: return is("object");
      case json::value_t::array: return is("array");
      case json::value_t::string: return is("string");
      case json::value_t::boolean: return is("boolean");
      case json::value_t::null: return is("null");
      case json::value_t::number_integer:
      case json::value_t::number_unsigned: return is("integer") || is("number");
      case json::value_t::number_float:
        return is("number") || (is("integer") && std::floor(v.get<double>()) == v.get<double>());
      default: return false;
    }
  }

  Element typed_value(const std::string& type, const json& schema, const std::string& path, int depth) {
    if (type == "object") return object(schema, path, depth);
    if (type == "array") return array(schema, path, depth);
    if (type == "string") return string(schema, path);
    if (type == "number" || type == "integer") return number(schema, path, type == "integer");
    if (type == "boolean") return literal_set({"true", "false"}, path, "boolean");
    return rule_of({b_.literal("null")}, "null");
  }

  Element reference(const json& ref, const std::string& path, int depth) {
    if (!ref.is_string()) return fail(path, "'$ref' must be a string");
    const std::string target = ref.get<std::string>();
    if (auto it = refs_.find(target); it != refs_.end()) return GrammarBuilder::ref(it->second);
    if (target.empty() || target[0] != '#') return fail(path, "'$ref' " + target + " is not in this document");
    // Walk the pointer.
    const json* at = &root_;
    size_t i = 1;
    if (i < target.size() && target[i] != '/') return fail(path, "'$ref' " + target + " is not a JSON pointer");
    while (i < target.size()) {
      const size_t next = target.find('/', i + 1);
      const std::string token = unescape_pointer_token(target.substr(i + 1, next - i - 1));
      if (at->is_object() && at->contains(token)) {
        at = &(*at)[token];
      } else if (at->is_array() && !token.empty() &&
                 token.find_first_not_of("0123456789") == std::string::npos && token.size() < 10 &&
                 std::stoul(token) < at->size()) {
        at = &(*at)[std::stoul(token)];
      } else {
        return fail(path, "'$ref' " + target + " points at nothing");
      }
      i = next == std::string::npos ? target.size() : next;
    }
    // A rule named for the target before compiling it, so that the target can refer to itself.
    const int32_t r = b_.fresh_rule("ref");
    refs_.emplace(target, r);
    b_.add_alternative(r, {value(*at, target, depth + 1)});
    return GrammarBuilder::ref(r);
  }

  // --- Objects. ---

  Element object(const json& schema, const std::string& path, int depth) {
    const json empty = json::object();
    const json& properties = schema.contains("properties") ? schema["properties"] : empty;
    if (!properties.is_object()) return fail(path, "'properties' must be an object");
    std::set<std::string> required;
    if (schema.contains("required")) {
      const json& r = schema["required"];
      if (!r.is_array()) return fail(path, "'required' must be an array");
      for (const json& name : r) {
        if (!name.is_string()) return fail(path, "'required' must list strings");
        if (!properties.contains(name.get<std::string>())) {
          return fail(path, "required property '" + name.get<std::string>() + "' is not in 'properties'");
        }
        required.insert(name.get<std::string>());
      }
    }
    std::optional<Element> extra;  // the value of a property not in `properties`
    if (!schema.contains("properties") && !schema.contains("additionalProperties")) extra = any_value();
    if (schema.contains("additionalProperties")) {
      const json& a = schema["additionalProperties"];
      if (!a.is_boolean() && !a.is_object()) return fail(path, "'additionalProperties' must be a boolean or a schema");
      if (!(a.is_boolean() && !a.get<bool>())) extra = value(a, path + "/additionalProperties", depth + 1);
    }
    struct Property {
      Alternative member;  // "key" ws ":" ws value
      bool required;
    };
    std::vector<Property> props;
    std::vector<std::string> keys;
    for (auto it = properties.begin(); it != properties.end(); ++it) {
      std::string key;
      try {
        key = json(it.key()).dump();
      } catch (const json::exception&) {
        return fail(path, "a property name is not valid UTF-8");
      }
      keys.push_back(key.substr(1, key.size() - 2));
      Alternative member = b_.literal(key);
      add_ws(member);
      member.push_back(b_.byte(':'));
      add_ws(member);
      member.push_back(value(it.value(), path + "/properties/" + it.key(), depth + 1));
      props.push_back({std::move(member), required.count(it.key()) > 0});
    }
    Alternative extra_member;
    if (extra) {
      extra_member = {string_except(keys, path)};
      add_ws(extra_member);
      extra_member.push_back(b_.byte(':'));
      add_ws(extra_member);
      extra_member.push_back(*extra);
    }
    // From property i on: `some` after a member has been written (each next one starts with a
    // comma), `first` before any (nonempty: at least one member follows). Built from the end.
    const size_t n = props.size();
    std::vector<Alternative> comma_members;
    Alternative comma;
    add_ws(comma);
    comma.push_back(b_.byte(','));
    add_ws(comma);
    Element some = extra ? b_.repeat([&] {
      Alternative a = comma;
      append(a, extra_member);
      return a;
    }(), 0, -1, "extra-members")
                         : rule_of({Alternative{}}, "members-end");
    std::optional<Element> first;
    if (extra) first = rule_of({list_of(extra_member, 1, -1, "extra-members")}, "extra-first");
    for (size_t i = n; i-- > 0;) {
      std::vector<Alternative> first_alts, some_alts;
      Alternative f = props[i].member;
      f.push_back(some);
      first_alts.push_back(std::move(f));
      if (!props[i].required && first) first_alts.push_back({*first});
      Alternative s = comma;
      append(s, props[i].member);
      s.push_back(some);
      some_alts.push_back(std::move(s));
      if (!props[i].required) some_alts.push_back({some});
      first = rule_of(std::move(first_alts), "members-first");
      some = rule_of(std::move(some_alts), "members");
    }
    std::vector<Alternative> alts;
    if (first) alts.push_back(wrapped('{', {*first}, '}'));
    if (required.empty()) alts.push_back(wrapped('{', {}, '}'));
    return rule_of(std::move(alts), "object");
  }

  // A JSON string (its canonical spelling) other than the given bodies (already JSON-escaped,
  // without quotes): a character trie of them, where at each node the string may end (unless a
  // body ends there), go on to a child, or take any other character and then anything.
  Element string_except(std::vector<std::string> bodies, const std::string& path) {
    for (const std::string& body : bodies) {
      if (body.size() > kMaxExceptKey) {
        return fail(path, "property names over " + std::to_string(kMaxExceptKey) +
                              " bytes are not supported beside 'additionalProperties'");
      }
    }
    std::sort(bodies.begin(), bodies.end());
    bodies.erase(std::unique(bodies.begin(), bodies.end()), bodies.end());
    const Element rest = b_.repeat({canonical_char({})}, 0, -1, "key-chars");
    const Element body = bodies.empty() ? rest : except_node(bodies, 0, bodies.size(), 0, rest);
    return rule_of({{b_.byte('"'), body, b_.byte('"')}}, "key");
  }

  // The canonical characters of the bodies in [lo, hi) share their first `at` bytes.
  Element except_node(const std::vector<std::string>& bodies, size_t lo, size_t hi, size_t at, Element rest) {
    std::vector<Alternative> alts;
    if (bodies[lo].size() != at) alts.push_back({});  // no body ends here: the string may
    std::vector<std::string> taken;                     // the next characters of the bodies
    for (size_t i = lo; i < hi;) {
      if (bodies[i].size() == at) {
        ++i;
        continue;
      }
      const std::string c = next_char(bodies[i], at);
      size_t j = i;
      while (j < hi && bodies[j].compare(at, c.size(), c) == 0 && bodies[j].size() > at) ++j;
      Alternative alt = b_.literal(c);
      alt.push_back(except_node(bodies, i, j, at + c.size(), rest));
      alts.push_back(std::move(alt));
      taken.push_back(c);
      i = j;
    }
    alts.push_back({canonical_char(taken), rest});
    return rule_of(std::move(alts), "key-node");
  }

  // The canonical character starting at byte `at` of a JSON-escaped body.
  static std::string next_char(const std::string& body, size_t at) {
    const unsigned char c = static_cast<unsigned char>(body[at]);
    size_t len = 1;
    if (c == '\\') {
      len = body.compare(at, 2, "\\u") == 0 ? 6 : 2;
    } else if (c >= 0xF0) {
      len = 4;
    } else if (c >= 0xE0) {
      len = 3;
    } else if (c >= 0xC0) {
      len = 2;
    }
    return body.substr(at, std::min(len, body.size() - at));
  }

  // One character in its canonical JSON spelling (raw, or the escape JSON requires), other than
  // the spellings in `excluded`.
  Element canonical_char(const std::vector<std::string>& excluded) {
    std::vector<std::pair<uint32_t, uint32_t>> raw = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
    std::vector<std::string> escapes = {"\\\"", "\\\\", "\\b", "\\f", "\\n", "\\r", "\\t"};
    for (uint32_t c = 0; c < 0x20; ++c) {
      if (c == 0x08 || c == 0x0C || c == 0x0A || c == 0x0D || c == 0x09) continue;
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      escapes.emplace_back(buf);
    }
    std::vector<std::pair<uint32_t, uint32_t>> gone;
    for (const std::string& e : excluded) {
      if (e[0] == '\\') {
        escapes.erase(std::remove(escapes.begin(), escapes.end(), e), escapes.end());
      } else {
        const uint32_t cp = code_point(e);
        gone.emplace_back(cp, cp);
      }
    }
    if (!gone.empty()) {
      // raw minus gone: complement of (complement(raw) + gone).
      std::vector<std::pair<uint32_t, uint32_t>> blocked = complement_code_points(raw);
      blocked.insert(blocked.end(), gone.begin(), gone.end());
      raw = complement_code_points(blocked);
    }
    std::vector<Alternative> alts;
    if (!raw.empty()) alts.push_back({b_.code_points(raw, "key-char")});
    for (const std::string& e : escapes) alts.push_back(b_.literal(e));
    return rule_of(std::move(alts), "key-char-or-escape");
  }

  static uint32_t code_point(const std::string& s) {
    const unsigned char c0 = static_cast<unsigned char>(s[0]);
    if (s.size() == 1) return c0;
    uint32_t cp = c0 & (s.size() == 2 ? 0x1F : s.size() == 3 ? 0x0F : 0x07);
    for (size_t i = 1; i < s.size(); ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
    return cp;
  }

  // --- Arrays. ---

  Element array(const json& schema, const std::string& path, int depth) {
    std::vector<Element> prefix;
    std::optional<Element> items;  // beyond the prefix
    bool items_given = false;
    auto read_prefix = [&](const json& list, const std::string& key) {
      if (!list.is_array()) return;
      for (size_t i = 0; i < list.size(); ++i) {
        prefix.push_back(value(list[i], path + "/" + key + "/" + std::to_string(i), depth + 1));
      }
    };
    auto read_items = [&](const json& s, const std::string& key) {
      items_given = true;
      if (s.is_boolean() && !s.get<bool>()) return;
      if (!s.is_object() && !s.is_boolean()) {
        fail(path, "'" + key + "' must be a schema");
        return;
      }
      items = value(s, path + "/" + key, depth + 1);
    };
    if (schema.contains("prefixItems")) {
      if (!schema["prefixItems"].is_array()) return fail(path, "'prefixItems' must be an array");
      read_prefix(schema["prefixItems"], "prefixItems");
      if (schema.contains("items")) read_items(schema["items"], "items");
    } else if (schema.contains("items") && schema["items"].is_array()) {
      read_prefix(schema["items"], "items");
      if (schema.contains("additionalItems")) read_items(schema["additionalItems"], "additionalItems");
    } else if (schema.contains("items")) {
      read_items(schema["items"], "items");
    }
    if (schema.contains("additionalItems") && !(schema.contains("items") && schema["items"].is_array())) {
      return fail(path, "'additionalItems' applies only beside 'items' as a list");
    }
    if (!items_given && prefix.empty()) items = any_value();  // no constraint on the items
    if (schema.contains("uniqueItems") && schema["uniqueItems"] != json(false)) {
      return fail(path, "'uniqueItems' is not supported");
    }
    int64_t min = 0, max = -1;
    if (!count(schema, "minItems", path, min) || !count(schema, "maxItems", path, max)) return b_.byte('?');
    if (max >= 0 && static_cast<int64_t>(prefix.size()) > max) prefix.resize(static_cast<size_t>(max));
    const int64_t k = static_cast<int64_t>(prefix.size());
    if (!items && (max < 0 || max > k)) max = k;
    if (max >= 0 && min > max) return fail(path, "'minItems' is more than the array can hold");
    if (max > GrammarBuilder::kMaxRepeat || min > GrammarBuilder::kMaxRepeat) {
      return fail(path, "item counts over " + std::to_string(GrammarBuilder::kMaxRepeat) + " are not supported");
    }
    std::vector<Alternative> alts;
    if (min == 0) alts.push_back(wrapped('[', {}, ']'));
    if (max != 0) {
      // after[j]: what may follow the j-th item (j >= 1), built from the end.
      Alternative comma;
      add_ws(comma);
      comma.push_back(b_.byte(','));
      add_ws(comma);
      Element tail = rule_of({Alternative{}}, "items-end");
      if (items) {
        Alternative more = comma;
        more.push_back(*items);
        const int64_t from = std::max<int64_t>(k, 1);
        tail = b_.repeat(more, std::max<int64_t>(0, min - from), max < 0 ? -1 : max - from, "items");
      }
      for (int64_t j = k - 1; j >= 1; --j) {  // after item j, item j+1 is prefix[j]
        std::vector<Alternative> next;
        Alternative go = comma;
        go.push_back(prefix[static_cast<size_t>(j)]);
        go.push_back(tail);
        next.push_back(std::move(go));
        if (j >= min) next.push_back({});
        tail = rule_of(std::move(next), "items-after");
      }
      Alternative inside{k > 0 ? prefix[0] : *items, tail};
      alts.push_back(wrapped('[', inside, ']'));
    }
    return rule_of(std::move(alts), "array");
  }

  // A non-negative integer keyword (absent: `out` unchanged).
  bool count(const json& schema, const char* key, const std::string& path, int64_t& out) {
    if (!schema.contains(key)) return true;
    const json& v = schema[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      fail(path, std::string("'") + key + "' must be a non-negative integer");
      return false;
    }
    out = v.get<int64_t>();
    return true;
  }

  // --- Strings. ---

  Element string(const json& schema, const std::string& path) {
    int64_t min = 0, max = -1;
    if (!count(schema, "minLength", path, min) || !count(schema, "maxLength", path, max)) return b_.byte('?');
    const bool lengths = schema.contains("minLength") || schema.contains("maxLength");
    if (schema.contains("pattern") || schema.contains("format")) {
      const char* key = schema.contains("pattern") ? "pattern" : "format";
      if (schema.contains("pattern") && schema.contains("format")) {
        return fail(path, "'pattern' beside 'format' is not supported");
      }
      if (lengths) return fail(path, std::string("'minLength' or 'maxLength' beside '") + key + "' is not supported");
      const json& v = schema[key];
      if (!v.is_string()) return fail(path, std::string("'") + key + "' must be a string");
      RegexOptions ro;
      ro.json_string = true;
      std::string pattern = v.get<std::string>();
      if (std::string(key) == "pattern") {
        ro.search = true;
      } else {
        const std::optional<std::string> p = format_pattern(pattern);
        if (!p) return fail(path, "'format' \"" + pattern + "\" is not supported");
        pattern = *p;
      }
      Result<Element> inner = add_regex(b_, pattern, ro, key);
      if (!inner.ok()) return fail(path, "'" + std::string(key) + "': " + inner.status().message());
      return rule_of({{b_.byte('"'), *inner, b_.byte('"')}}, "string");
    }
    if (max >= 0 && min > max) return fail(path, "'minLength' is more than 'maxLength'");
    if (max > GrammarBuilder::kMaxRepeat || min > GrammarBuilder::kMaxRepeat) {
      return fail(path, "string lengths over " + std::to_string(GrammarBuilder::kMaxRepeat) + " are not supported");
    }
    if (!lengths) return any_string();
    return rule_of({{b_.byte('"'), b_.repeat({json_char()}, min, max, "chars"), b_.byte('"')}}, "string");
  }

  // The formats as regular expressions over the value (ASCII: what each RFC allows). Dates: the
  // days of each month, February 29th in leap years only; a leap second only at 23:59:60 UTC,
  // written with Z or a zero offset (RFC 3339 5.7).
  static std::optional<std::string> format_pattern(const std::string& format) {
    static const std::string kDate =
        "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
        "02-(0[1-9]|1[0-9]|2[0-8]))|([0-9]{2}(0[48]|[2468][048]|[13579][26])|(0[048]|[2468][048]|[13579][26])00)"
        "-02-29)";
    static const std::string kTime =
        "(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])|"
        "23:59:60(\\.[0-9]+)?(Z|[+-]00:00))";
    static const std::string kLabel = "[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?";
    // A host name's labels are at most 63 characters (RFC 1123), and a name at most 253: three
    // labels keep it under.
    static const std::string kHostLabel = "[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?";
    // RFC 3986 URIs without IP-literal hosts: scheme ":" ("//" authority path | path) ["?" query]
    // ["#" fragment], every other character percent-encoded; the path not empty (as validators
    // such as ajv's check it).
    static const std::string kPct = "%[0-9A-Fa-f]{2}";
    static const std::string kSub = "!$&'()*+,;=";
    static const std::string kUnreserved = "A-Za-z0-9._~";
    static const std::string kPchar = "([" + kUnreserved + kSub + ":@-]|" + kPct + ")";
    static const std::string kAuthority = "(([" + kUnreserved + kSub + ":-]|" + kPct + ")*@)?([" + kUnreserved + kSub +
                                          "-]|" + kPct + ")*(:[0-9]*)?";
    static const std::string kPath = "(//" + kAuthority + "(/" + kPchar + "*)*|/(" + kPchar + "+(/" + kPchar +
                                     "*)*)?|" + kPchar + "+(/" + kPchar + "*)*)";
    static const std::string kTail = "([" + kUnreserved + kSub + ":@/?-]|" + kPct + ")*";
    static const std::map<std::string, std::string> kFormats = {
        {"date", kDate},
        {"time", kTime},
        {"date-time", kDate + "T" + kTime},
        {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
        {"email", "[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(" + kLabel + "\\.)+" + kLabel},
        {"ipv4", "((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\\.){3}(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"},
        {"hostname", kHostLabel + "(\\." + kHostLabel + "){0,2}"},
        {"uri", "[A-Za-z][A-Za-z0-9+.-]*:" + kPath + "(\\?" + kTail + ")?(#" + kTail + ")?"},
    };
    auto it = kFormats.find(format);
    if (it == kFormats.end()) return std::nullopt;
    return it->second;
  }

  // --- Numbers. ---

  // The lower (or, with `upper`, the upper) bound from `key` (inclusive) and `exclusive_key` (a
  // number: exclusive; draft 4's boolean: makes `key` exclusive), the tighter of the two. For an
  // integer a fractional bound rounds inward and becomes inclusive; a number's must be whole.
  bool bound(const json& schema, const char* key, const char* exclusive_key, bool integer, bool upper,
             const std::string& path, std::optional<Whole>& out, bool& open) {
    const bool draft4_open = schema.contains(exclusive_key) && schema[exclusive_key].is_boolean() &&
                             schema[exclusive_key].get<bool>();
    out.reset();
    open = false;
    for (const char* k : {key, exclusive_key}) {
      if (!schema.contains(k) || (k == exclusive_key && schema[k].is_boolean())) continue;
      const json& v = schema[k];
      if (!v.is_number()) {
        fail(path, std::string("'") + k + "' must be a number");
        return false;
      }
      Whole w;
      bool is_open = k == exclusive_key || draft4_open;
      if (v.is_number_integer()) {
        const std::string text = v.dump();
        w = {text[0] == '-', text[0] == '-' ? text.substr(1) : text};
      } else {
        const double d = v.get<double>();
        if (!std::isfinite(d) || std::fabs(d) >= 1e30) {
          fail(path, std::string("'") + k + "' is out of range");
          return false;
        }
        const double whole = upper ? std::floor(d) : std::ceil(d);
        if (whole != d) {
          if (!integer) {
            fail(path, std::string("'") + k + "' on a number must be a whole number");
            return false;
          }
          is_open = false;  // the rounding already steps past it
        }
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.0f", std::fabs(whole));
        w = {whole < 0 && std::string(buf) != "0", buf};
      }
      if (w.magnitude.size() > kMaxBoundDigits) {
        fail(path, std::string("'") + k + "' has too many digits");
        return false;
      }
      const int c = out ? compare_wholes(w, *out) : 0;
      if (!out || (upper ? c < 0 : c > 0) || (c == 0 && is_open)) {
        out = w;
        open = is_open;
      }
    }
    return true;
  }

  Element number(const json& schema, const std::string& path, bool integer) {
    std::optional<Whole> lo, hi;
    bool lo_open = false, hi_open = false;
    if (!bound(schema, "minimum", "exclusiveMinimum", integer, false, path, lo, lo_open) ||
        !bound(schema, "maximum", "exclusiveMaximum", integer, true, path, hi, hi_open)) {
      return b_.byte('?');
    }
    if (!lo && !hi) {
      if (!integer) return any_number();
      return rule_of({{b_.repeat({b_.byte('-')}, 0, 1, "sign"), natural()}}, "integer");
    }
    if (integer) {
      // Closed bounds on integers.
      if (lo && lo_open) lo = step(*lo, +1);
      if (hi && hi_open) hi = step(*hi, -1);
      lo_open = hi_open = false;
    }
    if (lo && hi) {
      const int c = compare_wholes(*lo, *hi);
      if (c > 0 || (c == 0 && (lo_open || hi_open))) return fail(path, "no number lies between the bounds");
    }
    std::vector<Alternative> alts;
    // Zero and above: magnitudes from max(lo, 0) to hi.
    const Whole zero{false, "0"};
    if (!hi || compare_wholes(*hi, zero) >= 0) {
      const bool lo_neg = !lo || compare_wholes(*lo, zero) < 0;
      const std::string a = lo_neg ? "0" : lo->magnitude;
      const bool a_open = lo_neg ? false : lo_open;
      nonnegative(alts, {}, a, a_open, hi ? std::optional<std::string>(hi->magnitude) : std::nullopt, hi_open,
                  integer);
    }
    // Below zero: "-" and magnitudes from max(-hi, 0) (open at zero) to -lo.
    if (!lo || compare_wholes(*lo, zero) < 0) {
      const bool hi_neg = hi && compare_wholes(*hi, zero) < 0;
      const std::string a = hi_neg ? hi->magnitude : "0";
      const bool a_open = hi_neg ? hi_open : true;
      nonnegative(alts, b_.literal("-"), a, a_open, lo ? std::optional<std::string>(lo->magnitude) : std::nullopt,
                  lo_open, integer);
    }
    return rule_of(std::move(alts), integer ? "integer" : "number");
  }

  // Adds `sign` followed by the magnitudes m with a <= m <= b (a < m when a_open; m < b when
  // b_open; b absent: no upper bound), as whole numbers or as decimals without an exponent.
  void nonnegative(std::vector<Alternative>& alts, const Alternative& sign, const std::string& a, bool a_open,
                   const std::optional<std::string>& b, bool b_open, bool integer) {
    auto with = [&](Alternative body) {
      Alternative alt = sign;
      append(alt, body);
      alts.push_back(std::move(alt));
    };
    const Element any_fraction = b_.repeat({b_.byte('.'), digits(1, -1)}, 0, 1, "fraction");
    const Element zero_fraction = b_.repeat({b_.byte('.'), b_.repeat({b_.byte('0')}, 1, -1, "zeros")}, 0, 1,
                                            "zero-fraction");
    // A fraction with a nonzero digit: "." [0-9]* [1-9] [0-9]*.
    const Alternative nonzero_fraction{b_.byte('.'), digits(0, -1), digit('1', '9'), digits(0, -1)};
    if (integer) {
      // Whole numbers in [a, b], shifted past an open end.
      const std::string lo = a_open ? add_one(a) : a;
      std::optional<std::string> hi = b;
      if (hi && b_open) {
        if (*hi == "0") return;
        hi = subtract_one(*hi);
      }
      if (hi && compare_magnitudes(lo, *hi) > 0) return;
      with({whole_range(lo, hi)});
      return;
    }
    if (b && compare_magnitudes(a, *b) >= 0) {  // at most the one value a
      if (compare_magnitudes(a, *b) == 0 && !a_open && !b_open) with({whole_range(a, a), zero_fraction});
      return;
    }
    // Whole part a: any fraction when a is included, else a nonzero one.
    {
      Alternative alt{whole_range(a, a)};
      if (a_open) {
        append(alt, nonzero_fraction);
      } else {
        alt.push_back(any_fraction);
      }
      with(alt);
    }
    // Whole parts strictly between: any fraction.
    const std::string next = add_one(a);
    if (!b) {
      with({whole_range(next, std::nullopt), any_fraction});
      return;
    }
    if (compare_magnitudes(next, *b) < 0) with({whole_range(next, subtract_one(*b)), any_fraction});
    // Whole part b, when b is included: nothing after it but zeros.
    if (!b_open) with({whole_range(*b, *b), zero_fraction});
  }

  // Whole numbers (no leading zeros) from lo to hi (absent: no limit), lo <= hi.
  Element whole_range(const std::string& lo, const std::optional<std::string>& hi) {
    std::vector<Alternative> alts;
    const size_t last = hi ? hi->size() : lo.size();
    for (size_t len = lo.size(); len <= last; ++len) {
      const std::string from = len == lo.size() ? lo : (len == 1 ? "0" : "1" + std::string(len - 1, '0'));
      const std::string to = hi && len == hi->size() ? *hi : std::string(len, '9');
      same_length_range(from, to, {}, alts);
    }
    if (!hi) {  // longer than lo: any
      alts.push_back({digit('1', '9'), digits(static_cast<int64_t>(lo.size()), kMaxWholeDigits - 1)});
    }
    return rule_of(std::move(alts), "whole");
  }

  // Digit strings of one length from lo to hi (lo <= hi), each after `prefix`.
  void same_length_range(const std::string& lo, const std::string& hi, Alternative prefix,
                         std::vector<Alternative>& alts) {
    size_t c = 0;
    while (c < lo.size() && lo[c] == hi[c]) prefix.push_back(b_.byte(static_cast<uint8_t>(lo[c++])));
    if (lo.find_first_not_of('0', c) == std::string::npos && hi.find_first_not_of('9', c) == std::string::npos) {
      // Every tail: any digits (without this, each level would split in two again).
      for (size_t i = c; i < lo.size(); ++i) prefix.push_back(digit());
      alts.push_back(std::move(prefix));
      return;
    }
    const size_t rest = lo.size() - c - 1;
    // The first differing digit: lo's, then any tail >= lo's; between, any tail; hi's, tail <= hi's.
    Alternative low = prefix;
    low.push_back(b_.byte(static_cast<uint8_t>(lo[c])));
    same_length_range(lo.substr(c + 1), std::string(rest, '9'), low, alts);
    if (lo[c] + 1 <= hi[c] - 1) {
      Alternative mid = prefix;
      mid.push_back(digit(static_cast<char>(lo[c] + 1), static_cast<char>(hi[c] - 1)));
      for (size_t i = 0; i < rest; ++i) mid.push_back(digit());
      alts.push_back(std::move(mid));
    }
    Alternative high = prefix;
    high.push_back(b_.byte(static_cast<uint8_t>(hi[c])));
    same_length_range(std::string(rest, '0'), hi.substr(c + 1), high, alts);
  }

  // --- Literals. ---

 public:
  // Exactly the given texts, factored by their common prefixes.
  Element literal_set(std::vector<std::string> texts, const std::string& path, const std::string& hint) {
    if (texts.size() > kMaxLiterals) {
      return fail(path, "more than " + std::to_string(kMaxLiterals) + " values are not supported");
    }
    std::sort(texts.begin(), texts.end());
    texts.erase(std::unique(texts.begin(), texts.end()), texts.end());
    return literal_node(texts, 0, texts.size(), 0, hint);
  }

 private:
  // The texts in [lo, hi) share their first `at` bytes (sorted, unique).
  Element literal_node(const std::vector<std::string>& texts, size_t lo, size_t hi, size_t at,
                       const std::string& hint) {
    // Their longest common prefix from `at` (that of the first and the last).
    size_t end = at;
    while (end < texts[lo].size() && end < texts[hi - 1].size() && texts[lo][end] == texts[hi - 1][end]) ++end;
    Alternative shared = b_.literal(std::string_view(texts[lo]).substr(at, end - at));
    if (hi - lo == 1) return rule_of({shared}, hint);
    std::vector<Alternative> alts;
    size_t i = lo;
    if (texts[i].size() == end) alts.push_back({}), ++i;  // one ends here (it sorts first)
    while (i < hi) {
      size_t j = i;
      while (j < hi && texts[j][end] == texts[i][end]) ++j;
      alts.push_back({literal_node(texts, i, j, end, hint)});
      i = j;
    }
    shared.push_back(rule_of(std::move(alts), hint));
    return rule_of({shared}, hint);
  }

  const json& root_;
  JsonSchemaOptions options_;
  GrammarBuilder b_;
  std::string error_;
  std::map<std::string, int32_t> refs_;
  int32_t ws_ = -1, value_ = -1, object_ = -1, array_ = -1, char_ = -1, string_ = -1, number_ = -1, natural_ = -1;
};

}  // namespace

Result<Grammar> json_schema_grammar(const json& schema, const JsonSchemaOptions& options) {
  return SchemaCompiler(schema, options).compile();
}

Grammar json_object_grammar(const JsonSchemaOptions& options) {
  const json none;
  return SchemaCompiler(none, options).object_only();
}

Result<Grammar> choice_grammar(const std::vector<std::string>& choices) {
  if (choices.empty()) return invalid_argument("the choice list is empty");
  const json none;
  return SchemaCompiler(none, {}).choices(choices);
}

}  // namespace pagoda::structured
