// The reasoning and tool-call parsers on model outputs of the kinds each one is for (Qwen3
// thinking and hermes calls, DeepSeek R1, Llama 3.1 JSON calls, Mistral, Llama 4 pythonic), each
// expectation written by hand from the text; every text is also streamed cut at every piece size
// and at random places, and the deltas must add up to the whole-output parse, with each call's
// name in its first delta. Malformed and hostile outputs (deep nesting, megabytes of brackets,
// unterminated strings) come back as text, quickly, and never crash (this binary runs under ASan
// and UBSan).
#include "server/output_parsers.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <sstream>

namespace pagoda::server {
namespace {

using Calls = std::vector<std::pair<std::string, std::string>>;  // (name, arguments)

struct Parsers {
  std::unique_ptr<ReasoningParser> reasoning;  // null: none
  std::unique_ptr<ToolParser> tools;           // null: none
};

Parsers parsers(std::string_view reasoning, std::string_view tools) {
  Parsers p;
  if (!reasoning.empty()) {
    auto r = make_reasoning_parser(reasoning);
    EXPECT_TRUE(r.ok()) << r.status().message();
    if (r.ok()) p.reasoning = std::move(r).value();
  }
  if (!tools.empty()) {
    auto t = make_tool_parser(tools);
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (t.ok()) p.tools = std::move(t).value();
  }
  return p;
}

Calls calls_of(const ParsedOutput& out) {
  Calls calls;
  for (const ParsedToolCall& c : out.tool_calls) calls.emplace_back(c.name, c.arguments);
  return calls;
}

std::string show(const ParsedOutput& out) {
  std::ostringstream s;
  s << "reasoning=" << (out.reasoning ? "[" + *out.reasoning + "]" : "none") << " content=[" << out.content << "]";
  for (const ParsedToolCall& c : out.tool_calls) s << " call " << c.name << "(" << c.arguments << ")";
  return s.str();
}

// Streams `text` cut at `cuts` (ascending), checks every delta's shape, and returns what the
// deltas add up to.
::testing::AssertionResult stream_pieces(const Parsers& p, std::string_view text, const std::vector<size_t>& cuts,
                                         ParsedOutput& sum) {
  OutputStream stream(p.reasoning.get(), p.tools.get());
  std::string reasoning;
  bool answer_started = false;
  std::string problem;
  auto take = [&](const OutputDelta& d) {
    if (!d.reasoning.empty() && answer_started && problem.empty()) problem = "thinking after the answer began";
    if (!d.content.empty() || !d.tool_calls.empty()) answer_started = true;
    reasoning += d.reasoning;
    sum.content += d.content;
    int last = -1;
    for (const ToolCallDelta& c : d.tool_calls) {
      if (c.index <= last && problem.empty()) problem = "call deltas out of order in one delta";
      last = c.index;
      if (!c.name && c.arguments.empty() && problem.empty()) problem = "an empty call delta";
      if (static_cast<size_t>(c.index) == sum.tool_calls.size()) {
        if (!c.name) {
          if (problem.empty()) problem = "call " + std::to_string(c.index) + "'s first delta has no name";
          sum.tool_calls.push_back({});
        } else {
          sum.tool_calls.push_back({*c.name, ""});
        }
      } else if (static_cast<size_t>(c.index) + 1 != sum.tool_calls.size() || c.name) {
        if (problem.empty()) problem = "a delta for call " + std::to_string(c.index) + " out of turn or naming it again";
        if (static_cast<size_t>(c.index) >= sum.tool_calls.size()) sum.tool_calls.resize(c.index + 1);
      }
      sum.tool_calls[c.index].arguments += c.arguments;
    }
  };
  size_t at = 0;
  for (size_t cut : cuts) {
    take(stream.push(text.substr(at, cut - at)));
    at = cut;
  }
  take(stream.push(text.substr(at)));
  take(stream.finish());
  if (!stream.finish().empty() || !stream.push("more").empty()) problem = "output after finish()";
  if (stream.reasoning_found()) sum.reasoning = reasoning;
  else if (!reasoning.empty() && problem.empty()) problem = "thinking text without thinking found";
  if (!problem.empty()) return ::testing::AssertionFailure() << problem;
  return ::testing::AssertionSuccess();
}

// The stream of `text` cut at `cuts` adds up to exactly parse_output(text).
::testing::AssertionResult streams_alike(const Parsers& p, std::string_view text, const std::vector<size_t>& cuts) {
  const ParsedOutput whole = parse_output(text, p.reasoning.get(), p.tools.get());
  ParsedOutput sum;
  ::testing::AssertionResult shape = stream_pieces(p, text, cuts, sum);
  std::ostringstream where;
  where << " (cuts:";
  for (size_t c : cuts) where << ' ' << c;
  where << ")";
  if (!shape) return shape << where.str();
  if (sum.reasoning != whole.reasoning || sum.content != whole.content || calls_of(sum) != calls_of(whole)) {
    return ::testing::AssertionFailure() << "streamed " << show(sum) << "\n   whole " << show(whole) << where.str();
  }
  return ::testing::AssertionSuccess();
}

// Every piece size from 1 to the text's length, and random cuts.
void expect_streams_alike(const Parsers& p, std::string_view text, int random_rounds = 60) {
  for (size_t size = 1; size <= std::max<size_t>(text.size(), 1); ++size) {
    std::vector<size_t> cuts;
    for (size_t c = size; c < text.size(); c += size) cuts.push_back(c);
    ASSERT_TRUE(streams_alike(p, text, cuts)) << "text: " << text;
  }
  std::mt19937 rng(1234);
  for (int round = 0; round < random_rounds && text.size() > 1; ++round) {
    std::vector<size_t> cuts;
    const size_t n = std::uniform_int_distribution<size_t>(1, std::min<size_t>(text.size() - 1, 24))(rng);
    for (size_t i = 0; i < n; ++i) cuts.push_back(std::uniform_int_distribution<size_t>(1, text.size() - 1)(rng));
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    ASSERT_TRUE(streams_alike(p, text, cuts)) << "text: " << text;
  }
}

// parse_output(text) is as written by hand, and streams add up to it.
void expect_parse(const Parsers& p, std::string_view text, const std::optional<std::string>& reasoning,
                  const std::string& content, const Calls& calls) {
  SCOPED_TRACE(std::string(text));
  const ParsedOutput out = parse_output(text, p.reasoning.get(), p.tools.get());
  EXPECT_EQ(out.reasoning, reasoning);
  EXPECT_EQ(out.content, content);
  EXPECT_EQ(calls_of(out), calls);
  expect_streams_alike(p, text);
}

// ---- names ----

TEST(OutputParsers, KnownNamesAndUnknownOnes) {
  for (const char* name : {"qwen3", "deepseek_r1"}) {
    auto r = make_reasoning_parser(name);
    ASSERT_TRUE(r.ok()) << name;
    EXPECT_EQ((*r)->end_tag(), "</think>");
  }
  for (const char* name : {"hermes", "llama3_json", "mistral", "pythonic"}) {
    auto t = make_tool_parser(name);
    ASSERT_TRUE(t.ok()) << name;
    EXPECT_EQ((*t)->needs_special_tokens(), std::string_view(name) == "mistral") << name;
  }
  auto r = make_reasoning_parser("qwen2");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("qwen3"), std::string::npos);
  EXPECT_NE(r.status().message().find("deepseek_r1"), std::string::npos);
  auto t = make_tool_parser("json");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("hermes"), std::string::npos);
  EXPECT_NE(t.status().message().find("pythonic"), std::string::npos);
}

TEST(OutputParsers, NoParsersPassTheTextThrough) {
  const Parsers p;
  expect_parse(p, "  <think>x</think> <tool_call>{}</tool_call>\n", std::nullopt,
               "  <think>x</think> <tool_call>{}</tool_call>\n", {});
  expect_parse(p, "", std::nullopt, "", {});
}

// ---- reasoning ----

TEST(OutputParsers, Qwen3Thinking) {
  const Parsers p = parsers("qwen3", "");
  expect_parse(p, "<think>\nabc\n</think>\n\nanswer", "\nabc\n", "answer", {});
  expect_parse(p, "Hello there", std::nullopt, "Hello there", {});
  expect_parse(p, "<think>\nstill thinking when the tokens ran out", "\nstill thinking when the tokens ran out", "", {});
  expect_parse(p, " \n<think>x</think>y", "x", "y", {});
  expect_parse(p, "<thinking> is not the tag", std::nullopt, "<thinking> is not the tag", {});
  expect_parse(p, "<think></think>", "", "", {});
  expect_parse(p, "<think>a</think>\r\n\n  indented code", "a", "  indented code", {});
  expect_parse(p, "an answer that says </think> in passing", std::nullopt, "an answer that says </think> in passing", {});
  expect_parse(p, "<think>a</think>b</think>c", "a", "b</think>c", {});
  expect_parse(p, "<think>a < b </thin and more", "a < b </thin and more", "", {});
  expect_parse(p, "<thi", std::nullopt, "<thi", {});
  expect_parse(p, "  ", std::nullopt, "  ", {});
  expect_parse(p, "", std::nullopt, "", {});
  expect_parse(p, "text <think>later</think>", std::nullopt, "text <think>later</think>", {});
}

TEST(OutputParsers, DeepSeekR1Thinking) {
  const Parsers p = parsers("deepseek_r1", "");
  expect_parse(p, "abc</think>answer", "abc", "answer", {});
  expect_parse(p, "<think>\nabc\n</think>\n\nanswer", "\nabc\n", "answer", {});
  expect_parse(p, "Okay, so the user asks", "Okay, so the user asks", "", {});
  expect_parse(p, "", "", "", {});
  expect_parse(p, " <think>x</think>y", " <think>x", "y", {});
  expect_parse(p, "</thin", "</thin", "", {});
  expect_parse(p, "</think>", "", "", {});
}

TEST(OutputParsers, WholeParseWrappers) {
  const Parsers p = parsers("qwen3", "hermes");
  std::string reasoning, rest;
  bool found = false;
  p.reasoning->parse("<think>hm</think>\n\nok <tool_call>{\"name\": \"f\"}</tool_call>", reasoning, rest, found);
  EXPECT_TRUE(found);
  EXPECT_EQ(reasoning, "hm");
  EXPECT_EQ(rest, "ok <tool_call>{\"name\": \"f\"}</tool_call>");
  std::string content;
  std::vector<ParsedToolCall> calls;
  p.tools->parse(rest, content, calls);
  EXPECT_EQ(content, "ok");
  ASSERT_EQ(calls.size(), 1u);
  EXPECT_EQ(calls[0].name, "f");
  EXPECT_EQ(calls[0].arguments, "{}");
}

// ---- hermes ----

// What Qwen3 writes when it calls two tools after thinking.
const char* const kQwen3TwoCalls =
    "<think>\nThe user wants the weather in Paris and in Tokyo. I should call get_weather twice.\n</think>\n\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n"
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Tokyo\", \"unit\": \"celsius\"}}\n</tool_call>";

TEST(OutputParsers, Qwen3ThinkingThenHermesCalls) {
  const Parsers p = parsers("qwen3", "hermes");
  expect_parse(p, kQwen3TwoCalls,
               "\nThe user wants the weather in Paris and in Tokyo. I should call get_weather twice.\n", "",
               {{"get_weather", R"({"city": "Paris", "unit": "celsius"})"},
                {"get_weather", R"({"city": "Tokyo", "unit": "celsius"})"}});
  expect_parse(p,
               "<think>\nA lookup will do.\n</think>\n\nLet me check that for you.\n<tool_call>\n"
               "{\"name\": \"search\", \"arguments\": {\"query\": \"tallest building\", \"top_k\": 3}}\n</tool_call>",
               "\nA lookup will do.\n", "Let me check that for you.",
               {{"search", R"({"query": "tallest building", "top_k": 3})"}});
  // Thinking off: the template wrote the empty thinking, the output is the answer.
  expect_parse(p, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>", std::nullopt, "",
               {{"now", "{}"}});
  // Calls written while thinking are thinking.
  expect_parse(p, "<think><tool_call>{\"name\": \"f\"}</tool_call>", "<tool_call>{\"name\": \"f\"}</tool_call>", "", {});
}

TEST(OutputParsers, HermesCalls) {
  const Parsers p = parsers("", "hermes");
  expect_parse(p, "text <tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>", std::nullopt, "text",
               {{"f", R"({"a": 1})"}});
  // Text after the calls stays, with the line breaks before it.
  expect_parse(p,
               "Checking.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\n\nDone, see above.",
               std::nullopt, "Checking.\n\nDone, see above.", {{"f", "{}"}});
  // Strings holding the markers, braces and escapes; the arguments exactly as written.
  expect_parse(p,
               R"X(<tool_call>{"name": "write_file", "arguments": {"path": "notes/a.txt", "text": "}</tool_call> <tool_call>{\"nested\": [1, {\"x\": null}]}\n\u00e9"}}</tool_call>)X",
               std::nullopt, "",
               {{"write_file",
                 R"X({"path": "notes/a.txt", "text": "}</tool_call> <tool_call>{\"nested\": [1, {\"x\": null}]}\n\u00e9"})X"}});
  // No arguments, null arguments, a string holding JSON, a string holding something else.
  expect_parse(p, "<tool_call>{\"name\": \"get_time\"}</tool_call>", std::nullopt, "", {{"get_time", "{}"}});
  expect_parse(p, "<tool_call>{\"name\": \"get_time\", \"arguments\": null}</tool_call>", std::nullopt, "",
               {{"get_time", "{}"}});
  expect_parse(p, R"(<tool_call>{"name": "f", "arguments": "{\"a\": [1, \"b\"]}"}</tool_call>)", std::nullopt, "",
               {{"f", R"({"a": [1, "b"]})"}});
  expect_parse(p, R"(<tool_call>{"name": "f", "arguments": " {\"a\": 1} "}</tool_call>)", std::nullopt, "",
               {{"f", R"({"a": 1})"}});
  expect_parse(p, R"(<tool_call>{"name": "f", "arguments": "hello"}</tool_call>)", std::nullopt, "",
               {{"f", R"("hello")"}});
  // The arguments before the name; other keys; "parameters".
  expect_parse(p, R"(<tool_call>{"arguments": {"q": "x"}, "name": "search"}</tool_call>)", std::nullopt, "",
               {{"search", R"({"q": "x"})"}});
  expect_parse(p, R"(<tool_call>{"name": "f", "id": [7, {"k": "v"}], "arguments": {"b": [true, false, -0.5e-3]}, "x": 1}</tool_call>)",
               std::nullopt, "", {{"f", R"({"b": [true, false, -0.5e-3]})"}});
  expect_parse(p, R"(<tool_call>{"name": "f", "parameters": {"b": 2}}</tool_call>)", std::nullopt, "",
               {{"f", R"({"b": 2})"}});
  // Without "</tool_call>": at the end, and before the next block.
  expect_parse(p, "<tool_call>{\"name\": \"f\", \"arguments\": {}}", std::nullopt, "", {{"f", "{}"}});
  expect_parse(p, "<tool_call>{\"name\": \"f\", \"arguments\": {}}\n<tool_call>{\"name\": \"g\", \"arguments\": {\"z\": 0}}</tool_call>",
               std::nullopt, "", {{"f", "{}"}, {"g", R"({"z": 0})"}});
  // Whitespace after the last call is dropped; text that only looks like markers stays.
  expect_parse(p, "<tool_call>{\"name\":\"f\",\"arguments\":{}}</tool_call>\n\n", std::nullopt, "", {{"f", "{}"}});
  expect_parse(p, "Just text, <b>bold</b>, a < sign and </tool_call>.\n", std::nullopt,
               "Just text, <b>bold</b>, a < sign and </tool_call>.\n", {});
  expect_parse(p, "ends with <tool_ca", std::nullopt, "ends with <tool_ca", {});
}

TEST(OutputParsers, MalformedHermesCallsStayText) {
  const Parsers p = parsers("", "hermes");
  for (const char* text : {
           "Sure. <tool_call>{\"name\": \"f\" \"arguments\": {}}</tool_call>",  // no comma after the name
           "<tool_call>{\"arguments\": {\"a\": 1}}</tool_call>",                 // no name
           "<tool_call>{\"name\": 5, \"arguments\": {}}</tool_call>",            // a number for a name
           "<tool_call>{\"name\": \"\", \"arguments\": {}}</tool_call>",         // an empty name
           "<tool_call>not json</tool_call>",
           "<tool_call>[{\"name\": \"f\"}]</tool_call>",
           "<tool_call>{'name': 'f'}</tool_call>",
           "<tool_call>{\"name\": \"f\", \"arguments\" {}}</tool_call>",         // no colon
           "Let me see <tool_call>{\"name\": \"f\", \"argu",                     // cut off before the arguments
           "<tool_call>",
           "<tool_call>\n\n",
       }) {
    expect_parse(p, text, std::nullopt, text, {});
  }
  // A bad block, then a good one: the bad one is text, up to its fault and on from there.
  expect_parse(p,
               "<tool_call>{\"name\": \"f\", \"arguments\" {}}</tool_call>\n<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>",
               std::nullopt, "<tool_call>{\"name\": \"f\", \"arguments\" {}}</tool_call>", {{"g", "{}"}});
  expect_parse(p, "<tool_call><tool_call>{\"name\": \"g\"}</tool_call>", std::nullopt, "<tool_call>", {{"g", "{}"}});
}

TEST(OutputParsers, HermesCallsCutShortAfterTheirNameKeepWhatCame) {
  const Parsers p = parsers("", "hermes");
  // The output ran out of tokens inside the arguments: the call keeps what was written.
  expect_parse(p, "<tool_call>{\"name\": \"f\", \"arguments\": {\"city\": \"Par", std::nullopt, "",
               {{"f", R"({"city": "Par)"}});
  expect_parse(p, "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\"", std::nullopt, "",
               {{"f", R"("{\"a\")"}});
  // Bad JSON inside the arguments: the call keeps them up to the fault; the rest is text.
  expect_parse(p, "<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": tru}}</tool_call>", std::nullopt,
               "}}</tool_call>", {{"f", R"({"a": tru)"}});
}

TEST(OutputParsers, HermesStreamsNameThenArgumentsAsTheyCome) {
  const Parsers p = parsers("", "hermes");
  OutputStream s(nullptr, p.tools.get());
  OutputDelta d = s.push("Hello <tool");
  EXPECT_EQ(d.content, "Hello");
  EXPECT_TRUE(d.tool_calls.empty());
  d = s.push("_call>\n{\"name\": \"get_weather\"");
  EXPECT_TRUE(d.empty());  // the name, but no arguments yet: not sure it is a call
  d = s.push(", \"arguments\": {\"city\": \"Par");
  ASSERT_EQ(d.tool_calls.size(), 1u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_EQ(d.tool_calls[0].name, "get_weather");
  EXPECT_EQ(d.tool_calls[0].arguments, "{\"city\": \"Par");
  d = s.push("is\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool");
  ASSERT_EQ(d.tool_calls.size(), 2u);
  EXPECT_EQ(d.tool_calls[0].index, 0);
  EXPECT_FALSE(d.tool_calls[0].name.has_value());
  EXPECT_EQ(d.tool_calls[0].arguments, "is\"}");
  EXPECT_EQ(d.tool_calls[1].index, 1);
  EXPECT_EQ(d.tool_calls[1].name, "g");
  EXPECT_EQ(d.tool_calls[1].arguments, "{}");
  EXPECT_EQ(d.content, "");
  d = s.push("_call>\n");
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(s.finish().empty());
}

TEST(OutputParsers, ThinkingStreamsBeforeTheAnswer) {
  const Parsers p = parsers("qwen3", "hermes");
  OutputStream s(p.reasoning.get(), p.tools.get());
  OutputDelta d = s.push("<thi");
  EXPECT_TRUE(d.empty());
  d = s.push("nk>\nStep one. </th");
  EXPECT_EQ(d.reasoning, "\nStep one. ");
  d = s.push("ink>\n");
  EXPECT_TRUE(d.empty());
  d = s.push("\nThe answer is 4.");
  EXPECT_EQ(d.content, "The answer is 4.");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_TRUE(s.reasoning_found());
  EXPECT_TRUE(s.finish().empty());
}

// ---- llama3_json ----

TEST(OutputParsers, Llama3JsonCalls) {
  const Parsers p = parsers("", "llama3_json");
  expect_parse(p, "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"location\": \"Paris, France\"}}", std::nullopt,
               "", {{"get_weather", R"({"location": "Paris, France"})"}});
  expect_parse(p, "{\"name\": \"a\", \"parameters\": {\"x\": 1}}; {\"name\": \"b\", \"parameters\": {}}", std::nullopt, "",
               {{"a", R"({"x": 1})"}, {"b", "{}"}});
  expect_parse(p, "\n {\"name\": \"a\", \"arguments\": {\"x\": 1.5e3}} ;{\"name\": \"b\"}\n", std::nullopt, "",
               {{"a", R"({"x": 1.5e3})"}, {"b", "{}"}});
  expect_parse(p, "The answer is {\"name\": 1}", std::nullopt, "The answer is {\"name\": 1}", {});
  expect_parse(p, "{\"location\": \"Paris\"}", std::nullopt, "{\"location\": \"Paris\"}", {});
  expect_parse(p, "<|python_tag|>print('hi')", std::nullopt, "<|python_tag|>print('hi')", {});
  expect_parse(p, "{\"name\": \"a\", \"parameters\": {}} and then text", std::nullopt, " and then text", {{"a", "{}"}});
  expect_parse(p, "{\"name\": \"a\", \"parameters\": {}}; {\"oops\": 1}", std::nullopt, "; {\"oops\": 1}", {{"a", "{}"}});
  expect_parse(p, "{\"name\": \"a\", \"parameters\": {}};", std::nullopt, ";", {{"a", "{}"}});
  expect_parse(p, "Hello {\"name\": \"a\", \"parameters\": {}}", std::nullopt, "Hello {\"name\": \"a\", \"parameters\": {}}", {});
}

// ---- mistral ----

TEST(OutputParsers, MistralCalls) {
  const Parsers p = parsers("", "mistral");
  expect_parse(p,
               "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, "
               "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}]",
               std::nullopt, "", {{"get_weather", R"({"city": "Paris"})"}, {"get_time", R"({"tz": "CET"})"}});
  expect_parse(p, "Let me look that up. [TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {}}]", std::nullopt,
               "Let me look that up.", {{"f", "{}"}});
  expect_parse(p, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{\"tz\": \"CET\"}",
               std::nullopt, "", {{"get_weather", R"({"city": "Paris"})"}, {"get_time", R"({"tz": "CET"})"}});
  expect_parse(p, "[TOOL_CALLS]get-weather.v2[CALL_ID]a1b2c3d4e[ARGS]{\"city\": \"Paris\"}", std::nullopt, "",
               {{"get-weather.v2", R"({"city": "Paris"})"}});
  expect_parse(p, "[TOOL_CALLS] not json", std::nullopt, "[TOOL_CALLS] not json", {});
  expect_parse(p, "[TOOL_CALLS][]", std::nullopt, "[TOOL_CALLS][]", {});
  expect_parse(p, "[TOOL_CALLS]f[ARGS]nope", std::nullopt, "[TOOL_CALLS]f[ARGS]nope", {});
  expect_parse(p, "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}}, {\"name\": 3}]", std::nullopt, ", {\"name\": 3}]",
               {{"f", "{}"}});
  expect_parse(p, "An array: [1, 2] and [TOOL_CALL", std::nullopt, "An array: [1, 2] and [TOOL_CALL", {});
}

// ---- pythonic ----

TEST(OutputParsers, PythonicCalls) {
  const Parsers p = parsers("", "pythonic");
  expect_parse(p, "<|python_start|>[get_weather(city=\"San Francisco\", days=3), get_time()]<|python_end|>", std::nullopt,
               "", {{"get_weather", R"({"city": "San Francisco", "days": 3})"}, {"get_time", "{}"}});
  expect_parse(p,
               R"X([f(s='it\'s', d="tab\there", u="caf\u00e9", n=None, t=True, fl=False, x=-1.5, e=1e3, big=123456789012345678901234567890, h=0x1F, l=[1, 'two', (3, 4), (5,)], d2={'k': [None], 1: 2.0, 'k': 'again'}, r=r'\d+', c="a" 'b',)])X",
               std::nullopt, "",
               {{"f", R"X({"s": "it's", "d": "tab\there", "u": "café", "n": null, "t": true, "fl": false, "x": -1.5, "e": 1000.0, "big": 123456789012345678901234567890, "h": 31, "l": [1, "two", [3, 4], [5]], "d2": {"k": "again", "1": 2.0}, "r": "\\d+", "c": "ab"})X"}});
  // Over several lines, a triple-quoted string.
  expect_parse(p, "[\n  write(text=\"\"\"line1\nline2\"\"\",\n        mode='w'),\n]", std::nullopt, "",
               {{"write", R"({"text": "line1\nline2", "mode": "w"})"}});
  expect_parse(p, "  [f()]\n", std::nullopt, "", {{"f", "{}"}});
  expect_parse(p, "[f()]\nDone.", std::nullopt, "\nDone.", {{"f", "{}"}});
  // Only the list at the start calls; what follows it is text.
  expect_parse(p, "[f(a=1)] [g()]", std::nullopt, " [g()]", {{"f", R"({"a": 1})"}});
  for (const char* text : {
           "I can't call tools for that.",
           "[get_weather(\"Paris\")]",         // a positional argument
           "[get_weather(city=\"Paris\")",     // never closed
           "[link](http://example.com)",
           "[f(a=b)]",                         // a name is not a literal
           "[f(a=1, a=2)]",                    // a repeated keyword
           "[f(a={1, 2})]",                    // a set
           "[]",
           "[obj.method(a=1)]",
           "[f(a=01)]",
           "[f(a=b'x')]",
           "<|python_start|>no list<|python_end|>",
       }) {
    expect_parse(p, text, std::nullopt, text, {});
  }
}

// ---- hostile outputs: bounded time, never a crash, still the same whole or streamed ----

TEST(OutputParsers, HostileOutputsAreBounded) {
  const Parsers hermes = parsers("", "hermes");
  const size_t n = 1 << 20;
  {
    // Nesting past the bound after the call began: the call keeps 512 brackets, the rest is text.
    const std::string head = "<tool_call>{\"name\": \"f\", \"arguments\": ";
    const ParsedOutput out = parse_output(head + std::string(n, '['), nullptr, hermes.tools.get());
    ASSERT_EQ(out.tool_calls.size(), 1u);
    EXPECT_EQ(out.tool_calls[0].arguments, std::string(512, '['));
    EXPECT_EQ(out.content, std::string(n - 512, '['));
  }
  {
    // Before the call began: all text.
    const std::string text = "<tool_call>{\"a\": " + std::string(n, '[');
    const ParsedOutput out = parse_output(text, nullptr, hermes.tools.get());
    EXPECT_TRUE(out.tool_calls.empty());
    EXPECT_EQ(out.content, text);
  }
  {
    std::string text;
    for (size_t i = 0; i < n / 11; ++i) text += "<tool_call>";
    const ParsedOutput out = parse_output(text, nullptr, hermes.tools.get());
    EXPECT_EQ(out.content, text);
  }
  const Parsers pythonic = parsers("", "pythonic");
  for (const std::string& text : {"[f(a=\"" + std::string(n, 'x'), "[f(a=" + std::string(n / 2, '[') + std::string(n / 2, ']') + ")]",
                                  "[f(a=" + std::string(n, '(')}) {
    const ParsedOutput out = parse_output(text, nullptr, pythonic.tools.get());
    EXPECT_TRUE(out.tool_calls.empty());
    EXPECT_EQ(out.content, text);
  }
  const Parsers llama = parsers("", "llama3_json");
  const std::string text = "{\"name\": \"f\", \"parameters\": {\"s\": \"" + std::string(n, 'y');
  const ParsedOutput out = parse_output(text, nullptr, llama.tools.get());
  ASSERT_EQ(out.tool_calls.size(), 1u);
  EXPECT_EQ(out.tool_calls[0].arguments, "{\"s\": \"" + std::string(n, 'y'));
}

// A 1 MB output (thinking, an answer, calls with large arguments) streamed a byte at a time.
TEST(OutputParsers, OneMegabyteStreamedByteByByte) {
  std::string thinking;
  while (thinking.size() < 300'000) thinking += "Let me think about the {\"braces\"} and <tool_call> tags here. ";
  std::string answer;
  while (answer.size() < 200'000) answer += "Here is some text with [brackets] and <b>tags</b>.\n";
  std::string big;
  while (big.size() < 500'000) big += "{\"k\": [1, 2.5, \"s\\n\"], \"t\": true}, ";
  const std::string args = "{\"items\": [" + big + "null]}";
  const std::string text = "<think>" + thinking + "</think>\n\n" + answer + "<tool_call>\n{\"name\": \"store\", \"arguments\": " +
                           args + "}\n</tool_call>\n<tool_call>\n{\"name\": \"done\", \"arguments\": {}}\n</tool_call>";
  ASSERT_GT(text.size(), 1'000'000u);
  const Parsers p = parsers("qwen3", "hermes");
  const auto start = std::chrono::steady_clock::now();
  OutputStream s(p.reasoning.get(), p.tools.get());
  ParsedOutput sum;
  std::string reasoning;
  for (char c : text) {
    OutputDelta d = s.push(std::string_view(&c, 1));
    sum.content += d.content;
    reasoning += d.reasoning;
    for (const ToolCallDelta& t : d.tool_calls) {
      if (t.name) sum.tool_calls.push_back({*t.name, ""});
      sum.tool_calls.back().arguments += t.arguments;
    }
  }
  EXPECT_TRUE(s.finish().empty());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("1 MB (%zu bytes) streamed in 1-byte pieces: %.3f s\n", text.size(), seconds);
  RecordProperty("one_megabyte_seconds", std::to_string(seconds));
  EXPECT_LT(seconds, 20.0);  // generous: about 0.05 s in Release; the sanitizer builds are slower
  EXPECT_EQ(reasoning, thinking);
  EXPECT_EQ(sum.content, answer.substr(0, answer.size() - 1));  // the line break before the call goes
  EXPECT_EQ(calls_of(sum), (Calls{{"store", args}, {"done", "{}"}}));
}

// Mutated outputs of every format: never a crash, and streams add up to the whole parse.
TEST(OutputParsers, MutatedOutputsStreamAlike) {
  const std::vector<std::pair<Parsers, std::string>> cases = [] {
    std::vector<std::pair<Parsers, std::string>> c;
    c.emplace_back(parsers("qwen3", "hermes"), kQwen3TwoCalls);
    c.emplace_back(parsers("deepseek_r1", "hermes"),
                   "Hmm.</think>\n\nOK <tool_call>{\"arguments\": \"{\\\"a\\\": 1}\", \"name\": \"f\"}</tool_call>");
    c.emplace_back(parsers("", "llama3_json"),
                   "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": [1, -2e5, null]}}; {\"name\": \"b\", \"parameters\": {}}");
    c.emplace_back(parsers("", "mistral"),
                   "Sure. [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {\"s\": \"\\u00e9\"}}][TOOL_CALLS]g[CALL_ID]x1[ARGS]{\"t\": 1}");
    c.emplace_back(parsers("", "pythonic"),
                   "<|python_start|>[f(a='x\\'y', b=[1, (2,)], c={'k': None}, d=\"\"\"q\"\"\"), g()]<|python_end|>");
    return c;
  }();
  const std::string alphabet = "{}[]()\"'\\:,;<>/ \n0aTN=[TOOL_CALLS]<tool_call></tool_call><think></think>";
  std::mt19937 rng(99);
  for (const auto& [p, original] : cases) {
    for (int round = 0; round < 150; ++round) {
      std::string text = original;
      const int edits = std::uniform_int_distribution<int>(1, 4)(rng);
      for (int e = 0; e < edits; ++e) {
        const size_t at = std::uniform_int_distribution<size_t>(0, text.size())(rng);
        const int kind = std::uniform_int_distribution<int>(0, 2)(rng);
        const char c = alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
        if (kind == 0 && at < text.size()) {
          text.erase(at, std::uniform_int_distribution<size_t>(1, 8)(rng));
        } else if (kind == 1 && at < text.size()) {
          text[at] = c;
        } else {
          text.insert(at, 1, c);
        }
      }
      for (int cut_round = 0; cut_round < 6; ++cut_round) {
        std::vector<size_t> cuts;
        const size_t step = std::uniform_int_distribution<size_t>(1, 7)(rng);
        for (size_t c = step; c < text.size(); c += std::uniform_int_distribution<size_t>(1, step)(rng)) cuts.push_back(c);
        ASSERT_TRUE(streams_alike(p, text, cuts)) << "text: " << text;
      }
    }
  }
}

}  // namespace
}  // namespace pagoda::server
