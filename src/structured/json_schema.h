// JSON Schema read into a Grammar whose texts are the JSON documents the schema accepts: OpenAI's
// response_format json_schema, vLLM's structured_outputs.json, tool-call arguments.
//
// Supported: `type` (one or a list), `enum`, `const`, `anyOf`, `oneOf` (as anyOf: an output can
// match two branches only where the branches overlap), `allOf` of one schema, `$ref` to "#" or a
// JSON pointer into the document ("#/$defs/X", "#/definitions/X"), recursion included;
//   objects: `properties` (written in the schema's order), `required`, `additionalProperties`
//     (false, true or a schema; absent beside `properties` counts as false, as OpenAI's strict
//     mode requires: a model given the choice invents keys; an object schema without either
//     takes any members);
//   arrays: `items`, `prefixItems` (and `items` as a list, draft 7's tuples), `minItems`,
//     `maxItems`, `uniqueItems: false`;
//   strings: `minLength`, `maxLength`, `pattern` (regex_grammar.h, matched anywhere unless
//     anchored, as JSON Schema says), `format` date, time, date-time, email, uuid, ipv4,
//     hostname (up to three labels), uri (RFC 3986, without IP-literal hosts); lengths count
//     characters, a \uD83D\uDE00 pair as one (a lone surrogate escape is not written);
//   numbers and integers: `minimum`, `maximum`, `exclusiveMinimum`, `exclusiveMaximum` (draft 4's
//     boolean form too), exact for integers; a number's bound must be a whole number, and a
//     bounded number is written without an exponent; a whole part has at most 32 digits and an
//     exponent at most 2 (parsers read JSON numbers as doubles, where 1e999 is infinity);
//   annotations, which are ignored: title, description, default, examples, $schema, $id,
//     $comment, deprecated, readOnly, writeOnly, $defs, definitions, and any "x-..." key.
// Any other keyword, or a value of the wrong kind, is an error that names it and where it is
// (e.g. "JSON schema: at #/properties/age: 'multipleOf' is not supported"), never ignored.
//
// Each value is written in one spelling: strings escape only what JSON requires (with \uXXXX in
// lowercase for other control characters), `enum` and `const` values as compact JSON. Whitespace
// between tokens is a run of space, tab, newline and carriage return of at most 32 bytes (enough
// for pretty-printed JSON eight levels deep, and a bound on the whitespace loops small models fall
// into), or none at all with `any_whitespace` false (vLLM's disable_any_whitespace); there is
// none before or after the document, so that generation ends as soon as the document does.
#pragma once

#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "structured/grammar.h"

namespace pagoda::structured {

struct JsonSchemaOptions {
  bool any_whitespace = true;
};

// (An ordered_json, parsed so: the properties' order is the order the model writes them in, and
// users order them on purpose, "reasoning" before "answer".)
Result<Grammar> json_schema_grammar(const nlohmann::ordered_json& schema, const JsonSchemaOptions& options = {});

// Any JSON object (response_format {"type": "json_object"}).
Grammar json_object_grammar(const JsonSchemaOptions& options = {});

// Exactly the given texts (a choice list); fails on an empty list.
Result<Grammar> choice_grammar(const std::vector<std::string>& choices);

}  // namespace pagoda::structured
