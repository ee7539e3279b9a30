// GBNF, llama.cpp's grammar notation (vLLM's `grammar` / `guided_grammar` takes it too), read
// into a Grammar rooted at the rule `root`.
//
//   root   ::= "yes" | "no" | number
//   number ::= [0-9]+ ("." [0-9]{1,3})?   # a comment
//
// Rules are `name ::= alternatives`, names of letters, digits, '-' and '_'. Items: "literals"
// and [classes] (ranges, [^...] negation) with the escapes \t \n \r \\ \" \[ \] \- \xHH \uHHHH
// \UHHHHHHHH, '.' (any character), (groups), references to rules, each optionally followed by
// *, +, ?, {m}, {m,}, {m,n} or {,n}. A rule ends at the end of its line, unless it is inside
// parentheses or the next line starts with '|'. Classes and '.' are over code points, matched as
// their UTF-8 bytes. Pure function; errors name the line and column.
#pragma once

#include <string_view>

#include "base/status.h"
#include "structured/grammar.h"

namespace pagoda::structured {

Result<Grammar> parse_gbnf(std::string_view text);

}  // namespace pagoda::structured
