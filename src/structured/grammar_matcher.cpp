#include "structured/grammar_matcher.h"

#include <algorithm>
#include <unordered_set>
#include <utility>

namespace pagoda::structured {

CompiledGrammar::CompiledGrammar(Grammar g) : grammar_(std::move(g)) {
  starts_.resize(grammar_.rules.size());
  for (size_t r = 0; r < grammar_.rules.size(); ++r) {
    for (const Alternative& alt : grammar_.rules[r].alternatives) {
      starts_[r].push_back(static_cast<int32_t>(items_.size()));
      for (const Element& e : alt) {
        items_.push_back(e.kind == Element::Kind::kBytes ? Item{e.index, -1} : Item{-1, e.index});
      }
      items_.push_back(Item{});
    }
  }
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  for (int32_t start : grammar_->starts(grammar_->grammar().root)) expand(start, -1, state_);
  std::sort(state_.nodes.begin(), state_.nodes.end());
  state_.nodes.erase(std::unique(state_.nodes.begin(), state_.nodes.end()), state_.nodes.end());
}

int32_t GrammarMatcher::intern(int32_t pos, int32_t parent) {
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  auto [it, added] = interned_.emplace(key, static_cast<int32_t>(nodes_.size()));
  if (added) nodes_.push_back(Node{pos, parent});
  return it->second;
}

void GrammarMatcher::expand(int32_t pos, int32_t parent, State& out) {
  // Depth-first over the references, with each (pos, parent) visited once: an ambiguous grammar
  // reaches the same continuation on several paths.
  std::unordered_set<uint64_t>& seen = seen_;
  seen.clear();
  work_.assign(1, {pos, parent});
  while (!work_.empty()) {
    auto [p, below] = work_.back();
    work_.pop_back();
    const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(p)) << 32) | static_cast<uint32_t>(below);
    if (!seen.insert(key).second) continue;
    const CompiledGrammar::Item& it = grammar_->item(p);
    if (it.end()) {
      if (below < 0) {
        out.accepting = true;
      } else {
        const Node n = nodes_[static_cast<size_t>(below)];  // the frame below goes on where it left off
        work_.emplace_back(n.pos, n.parent);
      }
    } else if (it.set >= 0) {
      out.nodes.push_back(intern(p, below));
    } else {
      // A reference last in its alternative continues as the frame below would: no frame of its own.
      const int32_t then = grammar_->item(p + 1).end() ? below : intern(p + 1, below);
      for (int32_t start : grammar_->starts(it.rule)) work_.emplace_back(start, then);
    }
  }
}

GrammarMatcher::State GrammarMatcher::advance(const State& from, uint8_t byte) {
  State next;
  for (int32_t n : from.nodes) {
    const Node node = nodes_[static_cast<size_t>(n)];
    if (grammar_->has(node.pos, byte)) expand(node.pos + 1, node.parent, next);
  }
  std::sort(next.nodes.begin(), next.nodes.end());
  next.nodes.erase(std::unique(next.nodes.begin(), next.nodes.end()), next.nodes.end());
  return next;
}

bool GrammarMatcher::accept(std::string_view bytes) {
  State s = state_;
  for (char c : bytes) {
    s = advance(s, static_cast<uint8_t>(c));
    if (s.nodes.empty() && !s.accepting) return false;  // (a match that ended takes no more bytes)
  }
  state_ = std::move(s);
  return true;
}

}  // namespace pagoda::structured
