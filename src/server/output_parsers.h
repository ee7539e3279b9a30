// What a chat model's output text holds besides the answer: its thinking (reasoning parsers) and
// its tool calls (tool-call parsers), taken apart as vLLM's --reasoning-parser and
// --tool-call-parser do, whole or streamed.
//
// Reasoning parsers:
//   qwen3        "<think>...</think>answer": the output must open with "<think>" (whitespace before
//                 it is dropped); an output that does not is all answer (thinking was off, found
//                 false), one with "<think>" and no "</think>" is all thinking (cut short).
//   deepseek_r1  "thinking...</think>answer": the template opens the thinking in the prompt, so the
//                 output starts inside it ("<think>" as its very first bytes, if there, is dropped);
//                 without "</think>" it is all thinking. Always found.
//   The thinking is the text exactly as between the tags. The answer after "</think>" loses its
//   leading line breaks ("\n", "\r": the "\n\n" Qwen3 and R1 write there) and nothing else.
//
// Tool-call parsers (the calls' arguments are JSON object texts):
//   hermes       <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number, anywhere in
//                 the answer (Qwen 2.5 / 3, Hermes). Whitespace around the JSON inside the block is
//                 syntax; a block the output ends in without "</tool_call>" still counts, and so
//                 does one whose "</tool_call>" is missing before the next text.
//   llama3_json  the output is one call {"name": ..., "parameters": {...}} or several joined by
//                 ";" (whitespace around it allowed), optionally after <|python_tag|> and leading
//                 whitespace (Llama 3.1 / 3.2 JSON tool calling); it must start so, else it is all
//                 answer.
//   mistral      [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...], or the newer
//                 [TOOL_CALLS]name[ARGS]{...} (also name[CALL_ID]id[ARGS]{...}), anywhere and any
//                 number of times (the control token's text is in the output: the request keeps
//                 special tokens, see needs_special_tokens)
//   pythonic     [f(a=1, b="x"), g()] as Python, optionally between <|python_start|> and
//                 <|python_end|> (Llama 4, Llama 3.2 pythonic), at the output's start (after
//                 whitespace); keyword arguments only, their values Python literals (strings with
//                 any quotes, prefixes r/u and escapes, adjacent strings joined, ints in any base,
//                 floats, True/False/None, lists, tuples, dicts), turned into JSON written as
//                 Python's json.dumps writes it ({"a": 1, "b": "x"}, non-ASCII kept). Anything
//                 else (a positional argument, a name as a value, a set, an empty list) leaves the
//                 whole list in the answer.
//   JSON call objects (hermes, llama3_json, mistral) take their name from "name" (a non-empty
//   string) and their arguments from "arguments" or "parameters", whichever comes first; other keys
//   are checked as JSON and ignored. The arguments are the object's text exactly as the model
//   wrote it; a JSON string holding a JSON object gives that object's text (decoded, whitespace
//   around it trimmed), another string gives the string's JSON text; null or no arguments gives
//   "{}"; an array, number or boolean is passed as written.
//
// Which text is a call, and what happens when the JSON goes wrong. A JSON call is a call from the
// moment its name has been read and its arguments' value has begun (or, without arguments, its
// object has closed), so that the name and then the arguments can stream. Before that, text that
// stops being a well-formed call (bad JSON, nesting deeper than 512, a non-string or empty name,
// an object closed without a name, the output ending) stays in the answer as text, from the
// call's opening marker up to the fault, and the answer goes on from the fault (where the next
// marker may start a call). After that, the call stands: if its JSON goes wrong or the output
// ends, it keeps the arguments read so far (possibly cut short and not valid JSON, as after a
// length cut-off) and the text from the fault on is answer. Text between or after calls that is
// not a call (a stray "; x" after Llama calls, a "</tool_call>" without its block) is answer too.
// A pythonic list is a call list only once its closing "]" has been read and the whole list
// parsed. Whitespace: a run of whitespace right before a call is dropped from the answer, and so
// is one that follows the last call and ends the output; other whitespace is kept
// ("Sure.\n<tool_call>...</tool_call>\n" has the answer "Sure."; "</tool_call>\n\nDone" keeps
// "\n\nDone").
//
// Streaming: push() takes the output's next piece of text and returns what became certain: the
// answer's and the thinking's new text, and the calls' new parts in OpenAI's delta shape (a
// call's index, its name once, in the call's first delta, then pieces of its arguments as they
// arrive, never a byte that a later piece could change). Held back until decided: a suffix that
// may be the start of a marker ("<tool_call>", "</think>", ...), whitespace (a call may follow),
// a call's text until it is a call (see above; arguments written before the name come with it),
// a hermes string holding the arguments (until it closes), and a whole pythonic list (until its
// "]"). Concatenating every delta of a stream gives exactly what parse_output() gives for the
// whole text, whatever the pieces are: parse_output() is a stream fed the whole text at once.
// The thinking's deltas all come before the answer's and the calls'. A push costs time in
// proportion to its piece, amortized: each byte is looked at a bounded number of times (held text
// once more at most, when it turns out to be answer): a 1 MB output streamed a byte at a time
// takes tens of milliseconds in Release.
//
// Pure and single-threaded: one stream per output (choice); the parser objects are immutable and
// may be shared.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace pagoda::server {

struct ParsedToolCall {
  std::string name;
  std::string arguments;  // a JSON object's text (see above for the exceptions)
};

struct ParsedOutput {
  std::string content;                   // the answer (outside thinking and calls)
  std::optional<std::string> reasoning;  // the thinking, when the reasoning parser found any
  std::vector<ParsedToolCall> tool_calls;
};

// One call's new parts in a stream (OpenAI's delta.tool_calls[i]).
struct ToolCallDelta {
  int index = 0;                    // which call of the output, from 0
  std::optional<std::string> name;  // set once, in the call's first delta
  std::string arguments;            // the arguments' next piece (may be empty)
};

struct OutputDelta {
  std::string content;
  std::string reasoning;
  std::vector<ToolCallDelta> tool_calls;  // at most one entry per call, in index order
  bool empty() const { return content.empty() && reasoning.empty() && tool_calls.empty(); }
};

class ReasoningParser {
 public:
  // One output's thinking, split off as its text arrives.
  class Splitter {
   public:
    virtual ~Splitter() = default;
    // Takes the output's next piece (`end`: nothing follows it) and appends what became certain:
    // the thinking's text to `reasoning`, the text after it to `rest`.
    virtual void push(std::string_view piece, bool end, std::string& reasoning, std::string& rest) = 0;
    // Whether the output has thinking (so far).
    virtual bool found() const = 0;
  };

  virtual ~ReasoningParser() = default;
  virtual std::unique_ptr<Splitter> start() const = 0;
  // The tag that ends the thinking ("</think>"), whose token starts structured outputs.
  virtual std::string end_tag() const = 0;

  // Splits a whole output into thinking and the rest.
  void parse(std::string_view text, std::string& reasoning, std::string& rest, bool& found) const;
};

class ToolParser {
 public:
  // One answer's calls, taken out as its text arrives.
  class Scanner {
   public:
    virtual ~Scanner() = default;
    // Takes the answer's next piece (`end`: nothing follows it) and appends what became certain
    // to out.content and out.tool_calls (indices from 0).
    virtual void push(std::string_view piece, bool end, OutputDelta& out) = 0;
  };

  virtual ~ToolParser() = default;
  virtual std::unique_ptr<Scanner> start() const = 0;
  // Whether the output must keep special tokens' text (mistral's [TOOL_CALLS]).
  virtual bool needs_special_tokens() const { return false; }

  // Takes the calls out of `text` (an answer, the thinking already removed).
  void parse(std::string_view text, std::string& content, std::vector<ParsedToolCall>& calls) const;
};

// nullptr and an error naming the known names when `name` is not one of them.
Result<std::unique_ptr<ReasoningParser>> make_reasoning_parser(std::string_view name);
Result<std::unique_ptr<ToolParser>> make_tool_parser(std::string_view name);

// The whole output, through the reasoning parser (may be null) and then the tool parser (may be
// null). Never throws for any text.
ParsedOutput parse_output(std::string_view text, const ReasoningParser* reasoning, const ToolParser* tools);

// Streams one output through the same parsers (which must outlive it).
class OutputStream {
 public:
  OutputStream(const ReasoningParser* reasoning, const ToolParser* tools);
  OutputDelta push(std::string_view piece);
  OutputDelta finish();  // the output ended: whatever was held back; later calls return nothing
  // Whether the reasoning parser has found thinking so far (ParsedOutput::reasoning's presence).
  bool reasoning_found() const { return splitter_ != nullptr && splitter_->found(); }

 private:
  void feed(std::string_view piece, bool end, OutputDelta& out);

  std::unique_ptr<ReasoningParser::Splitter> splitter_;  // null: no reasoning parser
  std::unique_ptr<ToolParser::Scanner> scanner_;         // null: no tool parser
  bool finished_ = false;
};

}  // namespace pagoda::server
