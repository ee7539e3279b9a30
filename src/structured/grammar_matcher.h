// Matching a Grammar byte by byte: the parse states, interned so that each step is a table lookup.
//
// A parse state is the set of parse stacks the bytes so far leave open (a grammar may be
// ambiguous, so there can be several), each a chain of positions in the grammar's alternatives:
// the top is the byte set the next byte must be in, the rest where to continue as each rule ends.
// Stacks are persistent and shared (a node is a position and the node below it, interned), and a
// reference that ends its alternative replaces its frame instead of pushing one, so right
// recursion (repetition) does not grow the stacks. Left recursion is refused when the grammar is
// built (grammar.h), so expanding a state ends.
//
// StateSpace interns the states too and remembers every transition it has computed, so that a
// state and a byte give the next state in one lookup once seen: text that revisits the same
// states (the characters of a string, the digits of a number) costs a lookup a byte.
//
// Not thread-safe: one StateSpace per sequence (or per compile).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "structured/grammar.h"

namespace pagoda::structured {

// A Grammar flattened for matching (after inline_small_rules): every alternative's elements
// followed by an end marker.
class CompiledGrammar {
 public:
  explicit CompiledGrammar(Grammar g);
  const Grammar& grammar() const { return grammar_; }

  struct Item {
    int32_t set = -1;   // >= 0: a byte of byte_sets[set]
    int32_t rule = -1;  // >= 0: a reference to rules[rule]
    bool end() const { return set < 0 && rule < 0; }
  };
  int32_t size() const { return static_cast<int32_t>(items_.size()); }
  const Item& item(int32_t pos) const { return items_[static_cast<size_t>(pos)]; }
  // The rule whose alternative holds position `pos`.
  int32_t rule_of(int32_t pos) const { return rule_of_[static_cast<size_t>(pos)]; }
  const std::vector<int32_t>& starts(int32_t rule) const { return starts_[static_cast<size_t>(rule)]; }
  const ByteSet& set(int32_t pos) const {
    return grammar_.byte_sets[static_cast<size_t>(items_[static_cast<size_t>(pos)].set)];
  }
  bool has(int32_t pos, uint8_t byte) const { return set(pos).has(byte); }

 private:
  Grammar grammar_;
  std::vector<Item> items_;
  std::vector<int32_t> rule_of_;
  std::vector<std::vector<int32_t>> starts_;  // by rule: the position of each alternative's first item
};

class StateSpace {
 public:
  explicit StateSpace(std::shared_ptr<const CompiledGrammar> grammar);
  // A space where a rule that ends over nothing continues at every place the grammar goes on
  // after it (`returns`, by rule), rather than ending the state: what can follow a rule in any
  // context. Only the root's end ends a state. (Token masks use it to drop suffixes that nothing
  // could take; token_grammar.cpp.)
  StateSpace(std::shared_ptr<const CompiledGrammar> grammar, std::vector<std::vector<int32_t>> returns);

  const std::shared_ptr<const CompiledGrammar>& grammar() const { return grammar_; }

  // States are ids; kDead has no stacks and has not ended (no text continues or ends it).
  static constexpr int32_t kDead = 0;
  // The state before the first byte.
  int32_t root();
  // The state of one stack: the byte-set item `pos` over nothing, so that the rule holding `pos`
  // ending ends the state (ended() true). Token masks start here (token_grammar.h).
  int32_t at(int32_t pos);
  // In a space made with `returns`: the state right after `rule` has ended, in any context.
  int32_t after_rule(int32_t rule);
  // The state that goes on after the rules on stack `node` up to its top have ended: the frames
  // below it continue (for the root stack, ended alone).
  int32_t after(int32_t node);
  // The state after `byte` (kDead when no stack takes it).
  int32_t next(int32_t state, uint8_t byte) {
    const size_t at = static_cast<size_t>(state) * 256 + byte;
    if (transitions_[at] >= 0) return transitions_[at];
    const int32_t to = advance(state, byte);  // (which may grow transitions_)
    transitions_[at] = to;
    return to;
  }
  int32_t next(int32_t state, std::string_view bytes) {
    for (char c : bytes) {
      state = next(state, static_cast<uint8_t>(c));
      if (state == kDead) break;
    }
    return state;
  }

  // Whether the text so far is a whole match (the root rule, or for at(), the rule of `pos`, can
  // end here).
  bool ended(int32_t state) const { return states_[static_cast<size_t>(state)].ended; }
  // Whether some byte can follow.
  bool can_continue(int32_t state) const {
    return states_[static_cast<size_t>(state)].end > states_[static_cast<size_t>(state)].begin;
  }
  // The open stacks, each a node whose position is a byte-set item.
  std::span<const int32_t> stacks(int32_t state) const {
    const StateInfo& s = states_[static_cast<size_t>(state)];
    return {stack_tops_.data() + s.begin, stack_tops_.data() + s.end};
  }
  // The bytes some stack takes next.
  const ByteSet& first_bytes(int32_t state) const { return states_[static_cast<size_t>(state)].first; }

  struct Node {
    int32_t pos;     // the byte-set item this stack waits on (or, below the top, where to go on)
    int32_t parent;  // the node below, -1 at the bottom
  };
  const Node& node(int32_t id) const { return nodes_[static_cast<size_t>(id)]; }

  size_t state_count() const { return states_.size(); }
  size_t node_count() const { return nodes_.size(); }

 private:
  struct StateInfo {
    uint32_t begin = 0, end = 0;  // stack_tops_[begin, end)
    bool ended = false;
    ByteSet first;
  };
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& v) const;
  };

  int32_t intern_node(int32_t pos, int32_t parent);
  // Adds to tops_ the stacks that continuing at `pos` over `parent` leads to, each topped by a
  // byte set; sets ended_ when the bottom rule ends.
  void expand(int32_t pos, int32_t parent);
  // The state of tops_ and ended_ (sorted and made unique here).
  int32_t intern_state();
  int32_t advance(int32_t state, uint8_t byte);

  std::shared_ptr<const CompiledGrammar> grammar_;
  std::vector<std::vector<int32_t>> returns_;  // empty unless the second constructor
  std::vector<Node> nodes_;
  std::unordered_map<uint64_t, int32_t> node_ids_;
  std::vector<StateInfo> states_;
  std::vector<int32_t> stack_tops_;
  std::unordered_map<std::vector<int32_t>, int32_t, KeyHash> state_ids_;  // tops, then -1 if ended
  std::vector<int32_t> transitions_;  // 256 a state, -1 until computed
  int32_t root_ = -1;
  std::unordered_map<int32_t, int32_t> at_, after_;

  // Scratch of expand() and intern_state().
  std::vector<int32_t> tops_;
  bool ended_ = false;
  std::vector<std::pair<int32_t, int32_t>> work_;
  std::unordered_set<uint64_t> seen_;
};

// One output matched byte by byte from the root.
class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) : space_(std::move(grammar)) {
    state_ = space_.root();
  }

  // Consumes `bytes` when the grammar allows every one of them in turn: true, and the state moves
  // on; false, and the state is as before.
  bool accept(std::string_view bytes) {
    const int32_t s = space_.next(state_, bytes);
    if (s == StateSpace::kDead) return false;
    state_ = s;
    return true;
  }
  // Whether the output so far is a whole match (the root rule can end here).
  bool can_end() const { return space_.ended(state_); }
  // Whether some byte can follow.
  bool can_continue() const { return space_.can_continue(state_); }

 private:
  StateSpace space_;
  int32_t state_;
};

}  // namespace pagoda::structured
