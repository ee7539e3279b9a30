// JSON Schema read into grammars: for each schema, documents written out by hand that it must
// accept and documents it must refuse (each reason is in the list beside it), and the errors for
// what is not supported. Random schemas and documents checked by an independent validator are in
// tests/structured (ajv).
#include "structured/json_schema.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "structured/grammar_matcher.h"

namespace pagoda::structured {
namespace {

using json = nlohmann::ordered_json;

std::shared_ptr<const CompiledGrammar> compile(const std::string& schema, bool any_whitespace = true) {
  Result<Grammar> g = json_schema_grammar(json::parse(schema), JsonSchemaOptions{any_whitespace});
  EXPECT_TRUE(g.ok()) << schema << ": " << g.status().message();
  if (!g.ok()) return nullptr;
  return std::make_shared<const CompiledGrammar>(std::move(*g));
}

bool matches(const std::shared_ptr<const CompiledGrammar>& g, const std::string& text) {
  GrammarMatcher m(g);
  return m.accept(text) && m.can_end();
}

void expect(const std::string& schema, const std::vector<std::string>& good, const std::vector<std::string>& bad,
            bool any_whitespace = true) {
  auto g = compile(schema, any_whitespace);
  ASSERT_NE(g, nullptr);
  for (const std::string& t : good) EXPECT_TRUE(matches(g, t)) << schema << " should accept " << t;
  for (const std::string& t : bad) EXPECT_FALSE(matches(g, t)) << schema << " should refuse " << t;
}

std::string error_of(const std::string& schema) {
  Result<Grammar> g = json_schema_grammar(json::parse(schema));
  return g.ok() ? std::string("(accepted)") : g.status().message();
}

TEST(JsonSchema, ScalarsAndTypeLists) {
  expect(R"({"type": "string"})", {R"("")", R"("a b")", R"("\"\\\/\b\f\n\r\t")", R"("\u00e9\u00E9")", "\"é😀\""},
         {"", "\"", R"("a)", "\"a\nb\"", R"("\x")", R"("\u12")", "a", R"("a" )", R"( "a")"});
  expect(R"({"type": "integer"})", {"0", "-0", "7", "-12", "1234567890123"}, {"01", "1.0", "1e3", "+1", "-", ""});
  expect(R"({"type": "number"})", {"0", "-0.5", "3.25", "1e10", "1E-3", "2.5e+7", "-0"},
         {"01", ".5", "1.", "1e", "--1", "0x10", "1.5.2"});
  expect(R"({"type": "boolean"})", {"true", "false"}, {"True", "1", "null", "tru"});
  expect(R"({"type": "null"})", {"null"}, {"nul", "None", "\"null\""});
  expect(R"({"type": ["string", "null"]})", {"null", R"("x")"}, {"1", "true"});
  expect(R"({"type": ["integer", "number"]})", {"1", "1.5"}, {"\"1\""});
}

TEST(JsonSchema, ObjectsKeepTheirOrderAndRequiredKeys) {
  const std::string s = R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"},
                            "c": {"type": "boolean"}}, "required": ["b"], "additionalProperties": false})";
  expect(s, {R"({"b":"x"})", R"({"a":1,"b":"x"})", R"({"b":"x","c":true})", R"({"a":1,"b":"x","c":false})",
             "{ \"a\" : 1 ,\n  \"b\":\"x\"\t}"},
         {"{}", R"({"a":1})",                 // b is required
          R"({"b":"x","a":1})",               // properties come in the schema's order
          R"({"b":"x","d":1})",               // no other keys
          R"({"b":"x",})", R"({,"b":"x"})",   // stray commas
          R"({"b":1})", R"({"b":"x","b":"y"})"});
  // All optional: the empty object too. additionalProperties absent counts as false.
  expect(R"({"properties": {"a": {"type": "null"}}})", {"{}", R"({"a":null})", "{ }"}, {R"({"b":null})"});
  // No whitespace at all without any_whitespace.
  expect(s, {R"({"a":1,"b":"x"})"}, {R"({"a": 1,"b":"x"})", R"({ "b":"x"})"}, false);
}

TEST(JsonSchema, AdditionalPropertiesTakeOtherKeysOnly) {
  const std::string s = R"({"type": "object", "properties": {"id": {"type": "integer"}},
                            "additionalProperties": {"type": "string"}})";
  expect(s, {"{}", R"({"id":1})", R"({"id":1,"x":"y"})", R"({"x":"y","z":"w"})", R"({"i":"a","idx":"b"})",
             R"({"":"e"})", R"({"\n":"e"})"},
         {R"({"id":"s"})",           // a listed key takes its own schema,
          R"({"id":1,"id":"s"})",    // and is not an additional one
          R"({"x":1})", R"({"x":"y","id":1})"});
  expect(R"({"type": "object", "additionalProperties": true})", {"{}", R"({"a":[1,{"b":null}]})"}, {"[]"});
}

TEST(JsonSchema, ArraysCountTheirItems) {
  expect(R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
         {"[1]", "[1,2]", "[1, 2, 3]", "[ 1 ]"}, {"[]", "[1,2,3,4]", "[1,]", "[\"a\"]", "[,1]"});
  expect(R"({"type": "array", "items": {"type": "string"}})", {"[]", R"(["a","b"])"}, {R"(["a",1])"});
  expect(R"({"type": "array"})", {"[]", R"([1,"a",null,{}])"}, {"{}"});
  // Tuples: prefixItems, then items (here: none beyond the prefix).
  expect(R"({"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "items": false})",
         {"[]", "[1]", R"([1,"a"])"}, {R"(["a"])", R"([1,"a",2])"});
  expect(R"({"prefixItems": [{"type": "integer"}], "items": {"type": "boolean"}, "minItems": 2})",
         {"[1,true]", "[1,true,false]"}, {"[1]", "[true,true]", "[]"});
  expect(R"({"items": [{"const": 1}], "additionalItems": {"const": 2}})", {"[]", "[1]", "[1,2,2]"}, {"[2]", "[1,1]"});
  expect(R"({"type": "array", "maxItems": 0})", {"[]"}, {"[1]"});
}

TEST(JsonSchema, StringLengthsPatternsAndFormats) {
  expect(R"({"type": "string", "minLength": 2, "maxLength": 3})", {R"("ab")", R"("abc")", R"("\n\t")", "\"é😀\""},
         {R"("a")", R"("abcd")", R"("")"});
  expect(R"({"type": "string", "pattern": "^[a-z]+[0-9]{2}$"})", {R"("ab12")", R"("z00")"},
         {R"("ab1")", R"("AB12")", R"("ab123")", R"(" ab12")"});
  // Unanchored: the pattern may match anywhere.
  expect(R"({"type": "string", "pattern": "[0-9]{3}"})", {R"("123")", R"("ab123cd")", R"("x\"1234")"},
         {R"("12")", R"("1x2x3")"});
  expect(R"({"type": "string", "format": "date"})", {R"("2024-02-29")", R"("1999-12-31")"},
         {R"("2024-13-01")", R"("2024-1-01")", R"("2024-00-10")", R"("2024-01-32")", R"("24-01-01")"});
  expect(R"({"type": "string", "format": "time"})", {R"("23:59:60Z")", R"("08:30:00.123+05:30")"},
         {R"("24:00:00Z")", R"("08:30Z")", R"("08:30:00")"});
  expect(R"({"type": "string", "format": "date-time"})", {R"("2024-05-01T12:00:00Z")"},
         {R"("2024-05-01 12:00:00Z")", R"("2024-05-01")"});
  expect(R"({"type": "string", "format": "uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"},
         {R"("123e4567e89b12d3a456426614174000")", R"("123e4567-e89b-12d3-a456-42661417400g")"});
  expect(R"({"type": "string", "format": "email"})", {R"("a.b+c@example.co.uk")", R"("x@y.z")"},
         {R"("a@b")", R"("@b.c")", R"("a..b@c.d")", R"("a b@c.d")", R"("a@-b.c")"});
  expect(R"({"type": "string", "format": "ipv4"})", {R"("192.168.0.1")", R"("0.0.0.0")", R"("255.255.255.255")"},
         {R"("256.1.1.1")", R"("1.2.3")", R"("01.2.3.4")"});
}

// What the property test's validator (ajv, tests/structured) showed: each of these once let
// through a text that a JSON Schema validator refuses.
TEST(JsonSchema, WhatValidatorsRefuseIsNotWritten) {
  // Numbers a double cannot hold (a parser reads them as infinity).
  expect(R"({"type": "number"})", {"1e99", "-2.5E-99", std::string(32, '9') + ".5"},
         {"1e999", "1e100", std::string(33, '9')});
  expect(R"({"type": "integer"})", {std::string(32, '7')}, {std::string(33, '7')});
  expect(R"({"type": "integer", "minimum": 5})", {"5", std::string(32, '8')}, {std::string(33, '8')});
  // Lengths count characters: an escaped surrogate pair is one; a lone surrogate is not written.
  expect(R"({"type": "string", "minLength": 2, "maxLength": 2})", {R"("\ud83d\ude00x")", R"("\u00e9x")"},
         {R"("\ud83d\ude00")", R"("\ud83dx")", R"("\ude00x")"});
  // JSON Schema's '.' is ECMAScript's: no line terminator.
  expect(R"({"type": "string", "pattern": "^a.b$"})", {R"("a-b")", "\"a\xC3\xA9" "b\""},
         {R"("a\nb")", R"("a\rb")", "\"a\xE2\x80\xA8" "b\"", "\"a\xE2\x80\xA9" "b\""});
  // URIs: percent signs with two hex digits, brackets only in IP literals (not written), one '#'.
  expect(R"({"type": "string", "format": "uri"})",
         {R"("https://example.com/a/b?x=1&y=%20#top")", R"("mailto:ada@example.com")", R"("urn:isbn:0451450523")",
          R"("http://user:pw@host:8080/")", R"("a:/")"},
         {R"("a:")", R"("a:%")", R"("a:%g0")", R"("a:b[c]")", R"("a:b#c#d")", R"("1a:b")", R"("a:b c")", R"("a://h:x/")"});
  // Host names: labels of at most 63 characters.
  expect(R"({"type": "string", "format": "hostname"})",
         {R"("example.com")", "\"" + std::string(63, 'a') + ".io\""},
         {"\"" + std::string(64, 'a') + ".io\"", R"("-a.com")", R"("a..b")"});
}

TEST(JsonSchema, NumericBoundsAreExact) {
  // Integers: every value at and around the bounds.
  expect(R"({"type": "integer", "minimum": -12, "maximum": 105})", {"-12", "-1", "0", "9", "10", "99", "100", "105"},
         {"-13", "106", "110", "999", "-100", "1000"});
  expect(R"({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10})", {"1", "9"}, {"0", "10", "-1"});
  expect(R"({"type": "integer", "minimum": 1.5, "maximum": 3.5})", {"2", "3"}, {"1", "4"});
  expect(R"({"type": "integer", "minimum": 0, "exclusiveMinimum": true})", {"1"}, {"0"});  // draft 4
  expect(R"({"type": "integer", "minimum": 998})", {"998", "999", "1000", "123456"}, {"997", "99", "-998"});
  expect(R"({"type": "integer", "maximum": -5})", {"-5", "-6", "-100"}, {"-4", "0", "5"});
  // Numbers with whole bounds: fractions inside, none past, no exponents.
  expect(R"({"type": "number", "minimum": 0, "maximum": 10})",
         {"0", "0.0", "0.5", "9.999", "10", "10.0", "10.000"}, {"-0.5", "10.5", "10.01", "11", "1e1", "-1"});
  expect(R"({"type": "number", "exclusiveMinimum": 1, "exclusiveMaximum": 2})", {"1.5", "1.0001", "1.99"},
         {"1", "1.0", "1.000", "2", "2.0", "0.5"});
  expect(R"({"type": "number", "minimum": -2.0, "exclusiveMaximum": 0})", {"-2", "-2.0", "-1.5", "-0.1"},
         {"0", "-0", "-2.5", "-3", "0.5", "-0.0"});
}

TEST(JsonSchema, EnumsConstsAndCombinations) {
  expect(R"({"enum": ["red", "green", 3, null, {"a": 1}]})", {R"("red")", R"("green")", "3", "null", R"({"a":1})"},
         {R"("blue")", R"("re")", "4", R"({"a": 1})"});
  expect(R"({"type": "string", "enum": ["a", "ab", "abc", 1]})", {R"("a")", R"("ab")", R"("abc")"}, {"1", R"("b")"});
  expect(R"({"const": "only"})", {R"("only")"}, {R"("onl")", R"("only1")"});
  expect(R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 1}]})", {"1", R"("a")"},
         {R"("ab")", "1.5"});
  expect(R"({"oneOf": [{"const": 1}, {"const": 2}]})", {"1", "2"}, {"3"});
  expect(R"({"allOf": [{"type": "boolean"}]})", {"true"}, {"1"});
  expect(R"({})", {"1", R"({"a":[]})", "null"}, {"", "nul"});
  expect(R"(true)", {"[]"}, {"]"});
}

TEST(JsonSchema, ReferencesIncludingRecursion) {
  const std::string tree = R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})";
  expect(tree, {R"({"v":1})", R"({"v":1,"kids":[]})", R"({"v":1,"kids":[{"v":2,"kids":[{"v":3}]},{"v":4}]})"},
         {R"({"kids":[]})", R"({"v":1,"kids":[{"kids":[]}]})"});
  // "#" is the whole document; definitions and escaped pointer tokens.
  expect(R"({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
             "required": ["next"]})",
         {R"({"next":null})", R"({"next":{"next":null}})"}, {"{}"});
  expect(R"({"definitions": {"a/b": {"const": 7}}, "$ref": "#/definitions/a~1b"})", {"7"}, {"8"});
}

TEST(JsonSchema, UnsupportedKeywordsAreNamedNeverIgnored) {
  EXPECT_EQ(error_of(R"({"type": "object", "properties": {"age": {"type": "integer", "multipleOf": 5}}})"),
            "JSON schema: at #/properties/age: 'multipleOf' is not supported");
  EXPECT_NE(error_of(R"({"not": {"type": "string"}})").find("'not' is not supported"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "array", "uniqueItems": true})").find("'uniqueItems'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "format": "ipv7"})").find("'format' \"ipv7\""), std::string::npos);
  EXPECT_NE(error_of(R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})").find("'allOf' with more"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"$ref": "http://example.com/s.json"})").find("is not in this document"), std::string::npos);
  EXPECT_NE(error_of(R"({"$ref": "#/$defs/missing"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "strin"})").find("not a JSON Schema type"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "number", "minimum": 0.5})").find("whole number"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("between the bounds"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "pattern": "(a)\\1"})").find("'pattern'"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "minLength": 3, "pattern": "a"})").find("beside 'pattern'"),
            std::string::npos);
  EXPECT_NE(error_of(R"({"type": "string", "properties": {}})").find("does not apply"), std::string::npos);
  EXPECT_NE(error_of(R"(false)").find("matches nothing"), std::string::npos);
  EXPECT_NE(error_of(R"({"required": ["x"]})").find("'x' is not in 'properties'"), std::string::npos);
  // Annotations are not constraints.
  EXPECT_EQ(error_of(R"({"title": "T", "description": "d", "default": 1, "examples": [1], "x-extra": 1,
                         "$schema": "https://json-schema.org/draft/2020-12/schema", "type": "integer"})"),
            "(accepted)");
}

TEST(JsonSchema, HostileSchemasAreRefusedOrBounded) {
  // Deep nesting.
  std::string deep = R"({"type": "integer"})";
  for (int i = 0; i < 100; ++i) deep = R"({"type": "array", "items": )" + deep + "}";
  EXPECT_NE(error_of(deep).find("nest deeper"), std::string::npos);
  // Huge counts and enums.
  EXPECT_NE(error_of(R"({"type": "string", "maxLength": 100000000})").find("not supported"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "array", "minItems": 100000000})").find("not supported"), std::string::npos);
  json big = json::object({{"enum", json::array()}});
  for (int i = 0; i < 5000; ++i) big["enum"].push_back(i);
  EXPECT_NE(error_of(big.dump()).find("more than 4096 values"), std::string::npos);
  EXPECT_NE(error_of(R"({"type": "integer", "minimum": 1e300})").find("out of range"), std::string::npos);
  // Wide ranges stay small (digit by digit, not one alternative per split), and exact at the ends.
  auto wide = compile(R"({"type": "integer", "minimum": -9007199254740991, "maximum": 9007199254740991})");
  ASSERT_NE(wide, nullptr);
  EXPECT_LT(wide->size(), 5000);
  for (const char* ok : {"9007199254740991", "-9007199254740991", "0", "1000000000000000"}) {
    EXPECT_TRUE(matches(wide, ok)) << ok;
  }
  for (const char* bad : {"9007199254740992", "-9007199254740992", "10000000000000000"}) {
    EXPECT_FALSE(matches(wide, bad)) << bad;
  }
  // Self-reference without progress is no grammar (it matches nothing), not a hang.
  EXPECT_NE(error_of(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"), "(accepted)");
}

TEST(JsonSchema, ObjectGrammarAndChoices) {
  auto g = std::make_shared<const CompiledGrammar>(json_object_grammar());
  for (const char* ok : {"{}", R"({"a":[1,2.5e3,"x",true,null,{"b":{}}]})", "{ \"k\" :\n [ ] }"}) {
    EXPECT_TRUE(matches(g, ok)) << ok;
  }
  for (const char* bad : {"[]", "1", R"({"a"})", R"({'a':1})", R"({"a":1,})"}) EXPECT_FALSE(matches(g, bad)) << bad;
  auto c = choice_grammar({"yes", "no", "y"});
  ASSERT_TRUE(c.ok());
  auto cg = std::make_shared<const CompiledGrammar>(std::move(*c));
  for (const char* ok : {"yes", "no", "y"}) EXPECT_TRUE(matches(cg, ok)) << ok;
  for (const char* bad : {"ye", "", "n", "yess"}) EXPECT_FALSE(matches(cg, bad)) << bad;
  EXPECT_FALSE(choice_grammar({}).ok());
}

}  // namespace
}  // namespace pagoda::structured
