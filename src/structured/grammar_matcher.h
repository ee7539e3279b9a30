// GrammarMatcher: where one output stands in a Grammar, advanced byte by byte.
//
// The state is the set of parse stacks the bytes so far leave open (a grammar may be ambiguous,
// so there can be several), each a chain of positions in the grammar's alternatives: the top is
// the byte set the next byte must be in, the rest where to continue as each rule ends. Stacks
// are persistent and shared (a node is a position and the node below it, interned), so that
// advancing copies nothing and states stay small; a reference that ends its alternative replaces
// its frame instead of pushing one, so right recursion (repetition) does not grow the stacks.
// Left recursion is refused when the grammar is built (grammar.h), so expanding a state ends.
//
// Not thread-safe: one matcher per sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "structured/grammar.h"

namespace pagoda::structured {

// A Grammar flattened for matching: every alternative's elements followed by an end marker.
class CompiledGrammar {
 public:
  explicit CompiledGrammar(Grammar g);
  const Grammar& grammar() const { return grammar_; }

  struct Item {
    int32_t set = -1;   // >= 0: a byte of byte_sets[set]
    int32_t rule = -1;  // >= 0: a reference to rules[rule]
    bool end() const { return set < 0 && rule < 0; }
  };
  const Item& item(int32_t pos) const { return items_[static_cast<size_t>(pos)]; }
  const std::vector<int32_t>& starts(int32_t rule) const { return starts_[static_cast<size_t>(rule)]; }
  bool has(int32_t pos, uint8_t byte) const {
    return grammar_.byte_sets[static_cast<size_t>(items_[static_cast<size_t>(pos)].set)].has(byte);
  }

 private:
  Grammar grammar_;
  std::vector<Item> items_;
  std::vector<std::vector<int32_t>> starts_;  // by rule: the position of each alternative's first item
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar);

  // Consumes `bytes` when the grammar allows every one of them in turn: true, and the state moves
  // on; false, and the state is as before.
  bool accept(std::string_view bytes);
  // Whether the output so far is a whole match (the root rule can end here).
  bool can_end() const { return state_.accepting; }
  // Whether some byte can follow.
  bool can_continue() const { return !state_.nodes.empty(); }

 private:
  struct State {
    std::vector<int32_t> nodes;  // sorted, unique: the open stacks, each topped by a byte set
    bool accepting = false;       // an empty stack: the root rule has ended
  };
  struct Node {
    int32_t pos;     // the byte-set item this stack waits on (or, below the top, where to go on)
    int32_t parent;  // the node below, -1 at the bottom
  };

  int32_t intern(int32_t pos, int32_t parent);
  // Adds to `out` the stacks that continuing at `pos` over `parent` leads to, each topped by a
  // byte set (or `accepting` when the root ends).
  void expand(int32_t pos, int32_t parent, State& out);
  State advance(const State& from, uint8_t byte);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> interned_;
  State state_;
  std::vector<std::pair<int32_t, int32_t>> work_;  // expand()'s stack of (pos, parent)
  std::unordered_set<uint64_t> seen_;               // and the (pos, parent) it has visited
};

}  // namespace pagoda::structured
