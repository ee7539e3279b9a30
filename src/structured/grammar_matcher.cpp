#include "structured/grammar_matcher.h"

#include <algorithm>
#include <utility>

namespace pagoda::structured {
namespace {

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

CompiledGrammar::CompiledGrammar(Grammar g) : grammar_(inline_small_rules(std::move(g))) {
  starts_.resize(grammar_.rules.size());
  for (size_t r = 0; r < grammar_.rules.size(); ++r) {
    for (const Alternative& alt : grammar_.rules[r].alternatives) {
      starts_[r].push_back(static_cast<int32_t>(items_.size()));
      for (const Element& e : alt) {
        items_.push_back(e.kind == Element::Kind::kBytes ? Item{e.index, -1} : Item{-1, e.index});
        rule_of_.push_back(static_cast<int32_t>(r));
      }
      items_.push_back(Item{});
      rule_of_.push_back(static_cast<int32_t>(r));
    }
  }
}

size_t StateSpace::KeyHash::operator()(const std::vector<int32_t>& v) const {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ v.size();
  for (int32_t x : v) h = (h ^ static_cast<uint32_t>(x)) * 0x100000001B3ull + (h >> 29);
  return static_cast<size_t>(h);
}

StateSpace::StateSpace(std::shared_ptr<const CompiledGrammar> grammar) : grammar_(std::move(grammar)) {
  tops_.clear();
  ended_ = false;
  intern_state();  // kDead
}

StateSpace::StateSpace(std::shared_ptr<const CompiledGrammar> grammar, std::vector<std::vector<int32_t>> returns)
    : StateSpace(std::move(grammar)) {
  returns_ = std::move(returns);
}

int32_t StateSpace::intern_node(int32_t pos, int32_t parent) {
  auto [it, added] = node_ids_.emplace(pair_key(pos, parent), static_cast<int32_t>(nodes_.size()));
  if (added) nodes_.push_back(Node{pos, parent});
  return it->second;
}

void StateSpace::expand(int32_t pos, int32_t parent) {
  // Depth-first over the references, with each (pos, parent) visited once: an ambiguous grammar
  // reaches the same continuation on several paths.
  seen_.clear();
  work_.assign(1, {pos, parent});
  while (!work_.empty()) {
    auto [p, below] = work_.back();
    work_.pop_back();
    if (!seen_.insert(pair_key(p, below)).second) continue;
    const CompiledGrammar::Item& it = grammar_->item(p);
    if (it.end()) {
      if (below < 0) {
        const int32_t rule = grammar_->rule_of(p);
        if (returns_.empty() || rule == grammar_->grammar().root) ended_ = true;
        if (!returns_.empty()) {
          for (int32_t q : returns_[static_cast<size_t>(rule)]) work_.emplace_back(q, -1);
        }
      } else {
        const Node n = nodes_[static_cast<size_t>(below)];  // the frame below goes on where it left off
        work_.emplace_back(n.pos, n.parent);
      }
    } else if (it.set >= 0) {
      tops_.push_back(intern_node(p, below));
    } else {
      // A reference last in its alternative continues as the frame below would: no frame of its own.
      const int32_t then = grammar_->item(p + 1).end() ? below : intern_node(p + 1, below);
      for (int32_t start : grammar_->starts(it.rule)) work_.emplace_back(start, then);
    }
  }
}

int32_t StateSpace::intern_state() {
  std::sort(tops_.begin(), tops_.end());
  tops_.erase(std::unique(tops_.begin(), tops_.end()), tops_.end());
  std::vector<int32_t> key = tops_;
  if (ended_) key.push_back(-1);
  auto [it, added] = state_ids_.emplace(std::move(key), static_cast<int32_t>(states_.size()));
  if (added) {
    StateInfo info;
    info.begin = static_cast<uint32_t>(stack_tops_.size());
    for (int32_t n : tops_) {
      stack_tops_.push_back(n);
      const ByteSet& set = grammar_->set(nodes_[static_cast<size_t>(n)].pos);
      for (size_t w = 0; w < info.first.bits.size(); ++w) info.first.bits[w] |= set.bits[w];
    }
    info.end = static_cast<uint32_t>(stack_tops_.size());
    info.ended = ended_;
    states_.push_back(info);
    transitions_.resize(transitions_.size() + 256, -1);
  }
  return it->second;
}

int32_t StateSpace::root() {
  if (root_ < 0) {
    tops_.clear();
    ended_ = false;
    for (int32_t start : grammar_->starts(grammar_->grammar().root)) expand(start, -1);
    root_ = intern_state();
  }
  return root_;
}

int32_t StateSpace::at(int32_t pos) {
  if (auto it = at_.find(pos); it != at_.end()) return it->second;
  tops_.assign(1, intern_node(pos, -1));
  ended_ = false;
  const int32_t s = intern_state();
  at_.emplace(pos, s);
  return s;
}

int32_t StateSpace::after_rule(int32_t rule) {
  tops_.clear();
  ended_ = rule == grammar_->grammar().root;
  for (int32_t q : returns_[static_cast<size_t>(rule)]) expand(q, -1);
  return intern_state();
}

int32_t StateSpace::after(int32_t node) {
  if (auto it = after_.find(node); it != after_.end()) return it->second;
  tops_.clear();
  ended_ = false;
  const int32_t below = nodes_[static_cast<size_t>(node)].parent;
  if (below < 0) {
    ended_ = true;
  } else {
    const Node n = nodes_[static_cast<size_t>(below)];
    expand(n.pos, n.parent);
  }
  const int32_t s = intern_state();
  after_.emplace(node, s);
  return s;
}

int32_t StateSpace::advance(int32_t state, uint8_t byte) {
  if (!states_[static_cast<size_t>(state)].first.has(byte)) return kDead;
  tops_.clear();
  ended_ = false;
  const StateInfo info = states_[static_cast<size_t>(state)];
  for (uint32_t i = info.begin; i < info.end; ++i) {
    const Node n = nodes_[static_cast<size_t>(stack_tops_[i])];
    if (grammar_->has(n.pos, byte)) expand(n.pos + 1, n.parent);
  }
  return intern_state();
}

}  // namespace pagoda::structured
