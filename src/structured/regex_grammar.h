// Regular expressions read into a Grammar: vLLM's `regex` structured output (the whole output
// matches), and JSON Schema's `pattern` (json_schema.h), where the matched text is a JSON string's
// value and each character is written as JSON writes it.
//
// The syntax is the common subset of ECMAScript (JSON Schema's dialect) and Python's `re`:
// literals; '.' (any character but '\n', as Python's; with json_string, JSON Schema's patterns,
// any but ECMAScript's line terminators \n \r U+2028 U+2029); classes [a-z], [^...] with the escapes below inside
// (and \b, the backspace, there); \d \D \w \W \s \S; \t \n \r \f \v \0 \xHH \uHHHH \u{H...} (a
// \uHHHH\uHHHH surrogate pair is the one character it encodes) and escaped ASCII punctuation or
// space; groups (...), (?:...) and named groups (?<name>...) / (?P<name>...); alternation |; the
// quantifiers * + ? {m} {m,} {m,n}, greedy or lazy (the same language), at most 10000
// (GrammarBuilder::kMaxRepeat); '^' at the very start and '$' at the very end (with '|' at the
// top, as in both dialects, '^' anchors the first alternative only and '$' the last only).
// \d is [0-9], \w [A-Za-z0-9_], \s ECMAScript's white space and line terminators (U+0009-U+000D,
// U+0020, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000, U+FEFF).
// A lone ']' or '}' is itself; a '{' that starts no quantifier is refused (the dialects differ on
// it, and on {,n}), and so is an empty class [] or [^]. Anything else is refused with an error
// "regex: <what> '<text>' at offset N ...": backreferences, lookaround, word boundaries, inline
// flags, possessive quantifiers, anchors elsewhere, octal escapes, Unicode properties, groups
// nested deeper than 200, a group name used twice, pattern text that is not UTF-8, and patterns
// whose grammar would be too large (over a million items or GrammarBuilder::kMaxRules rules).
// Classes and '.' are over code points, matched as their UTF-8 bytes. Pure functions.
#pragma once

#include <string>
#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace pagoda::structured {

struct RegexOptions {
  // Each matched character as it is written inside a JSON string: '"' as \", '\' as \\, the
  // control characters as \b \f \n \r \t or \u00xx in lowercase hex (the one form JSON writers
  // use for each, so that a value has one spelling), any other character as itself.
  bool json_string = false;
  // JSON Schema's semantics: the pattern matches anywhere in the text (any text may come before
  // it unless it starts with '^', and after it unless it ends with '$'). Otherwise the whole text
  // must match, and '^' and '$' are allowed but change nothing.
  bool search = false;
};

// Adds to `b` the rules matching `pattern`, returning the element that matches it (a reference to
// a new rule named from `hint`). A refused pattern may leave rules in `b` that nothing uses (every
// one complete, so that `b` can still be built).
Result<Element> add_regex(GrammarBuilder& b, std::string_view pattern, const RegexOptions& options,
                          const std::string& hint);

// A Grammar whose root matches exactly the texts `pattern` matches (whole-text semantics).
Result<Grammar> regex_grammar(std::string_view pattern);

}  // namespace pagoda::structured
