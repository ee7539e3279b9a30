#include "structured/token_grammar.h"

#include <algorithm>
#include <chrono>
#include <string_view>

namespace pagoda::structured {
namespace {

void add_all(ByteSet& to, const ByteSet& from) {
  for (size_t w = 0; w < to.bits.size(); ++w) to.bits[w] |= from.bits[w];
}

// FOLLOW sets: for each rule, the bytes that can come right after it ends, anywhere in the grammar
// (from FIRST sets of what follows each reference, and a rule's own FOLLOW where that can be
// empty), to a fixed point.
std::vector<ByteSet> follow_sets(const CompiledGrammar& g) {
  const size_t rules = g.grammar().rules.size();
  const int32_t items = g.size();
  std::vector<ByteSet> first_rule(rules);
  std::vector<bool> nullable_rule(rules, false);
  // FIRST and nullable of the rest of an alternative from each position, right to left.
  std::vector<ByteSet> first(static_cast<size_t>(items));
  std::vector<bool> nullable(static_cast<size_t>(items), false);
  auto sweep = [&] {
    for (int32_t p = items - 1; p >= 0; --p) {
      const CompiledGrammar::Item& it = g.item(p);
      ByteSet f;
      bool null = false;
      if (it.end()) {
        null = true;
      } else if (it.set >= 0) {
        f = g.set(p);
      } else {
        f = first_rule[static_cast<size_t>(it.rule)];
        if (nullable_rule[static_cast<size_t>(it.rule)]) {
          add_all(f, first[static_cast<size_t>(p + 1)]);
          null = nullable[static_cast<size_t>(p + 1)];
        }
      }
      first[static_cast<size_t>(p)] = f;
      nullable[static_cast<size_t>(p)] = null;
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    sweep();
    for (size_t r = 0; r < rules; ++r) {
      ByteSet f = first_rule[r];
      bool null = nullable_rule[r];
      for (int32_t start : g.starts(static_cast<int32_t>(r))) {
        add_all(f, first[static_cast<size_t>(start)]);
        null = null || nullable[static_cast<size_t>(start)];
      }
      if (!(f == first_rule[r]) || null != nullable_rule[r]) {
        first_rule[r] = f;
        nullable_rule[r] = null;
        changed = true;
      }
    }
  }
  std::vector<ByteSet> follow(rules);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t p = 0; p < items; ++p) {
      const CompiledGrammar::Item& it = g.item(p);
      if (it.rule < 0) continue;
      ByteSet f = follow[static_cast<size_t>(it.rule)];
      add_all(f, first[static_cast<size_t>(p + 1)]);
      if (nullable[static_cast<size_t>(p + 1)]) add_all(f, follow[static_cast<size_t>(g.rule_of(p))]);
      if (!(f == follow[static_cast<size_t>(it.rule)])) {
        follow[static_cast<size_t>(it.rule)] = f;
        changed = true;
      }
    }
  }
  return follow;
}

// For each rule, the positions where the grammar goes on after the rule ends: those after each
// reference to it, and where a reference ends its alternative, those of the rule holding it.
std::vector<std::vector<int32_t>> return_positions(const CompiledGrammar& g) {
  const size_t rules = g.grammar().rules.size();
  std::vector<std::vector<int32_t>> direct(rules);
  std::vector<std::vector<int32_t>> tail_callers(rules);  // rules that end with a reference to it
  for (int32_t p = 0; p < g.size(); ++p) {
    const int32_t r = g.item(p).rule;
    if (r < 0) continue;
    if (g.item(p + 1).end()) {
      tail_callers[static_cast<size_t>(r)].push_back(g.rule_of(p));
    } else {
      direct[static_cast<size_t>(r)].push_back(p + 1);
    }
  }
  std::vector<std::vector<int32_t>> out(rules);
  for (size_t r = 0; r < rules; ++r) {
    // The rules whose end is r's end, through chains of tail references.
    std::vector<bool> seen(rules, false);
    std::vector<size_t> work{r};
    seen[r] = true;
    while (!work.empty()) {
      const size_t at = work.back();
      work.pop_back();
      out[r].insert(out[r].end(), direct[at].begin(), direct[at].end());
      for (int32_t caller : tail_callers[at]) {
        if (!seen[static_cast<size_t>(caller)]) {
          seen[static_cast<size_t>(caller)] = true;
          work.push_back(static_cast<size_t>(caller));
        }
      }
    }
    std::sort(out[r].begin(), out[r].end());
    out[r].erase(std::unique(out[r].begin(), out[r].end()), out[r].end());
  }
  return out;
}

// The rules the root can reach.
std::vector<bool> reachable_rules(const CompiledGrammar& g) {
  std::vector<bool> seen(g.grammar().rules.size(), false);
  std::vector<int32_t> work{g.grammar().root};
  seen[static_cast<size_t>(g.grammar().root)] = true;
  while (!work.empty()) {
    const int32_t r = work.back();
    work.pop_back();
    for (int32_t p : g.starts(r)) {
      for (; !g.item(p).end(); ++p) {
        const int32_t to = g.item(p).rule;
        if (to >= 0 && !seen[static_cast<size_t>(to)]) {
          seen[static_cast<size_t>(to)] = true;
          work.push_back(to);
        }
      }
    }
  }
  return seen;
}

}  // namespace

Result<std::shared_ptr<const TokenGrammar>> TokenGrammar::compile(std::shared_ptr<const CompiledGrammar> grammar,
                                                                  std::shared_ptr<const TokenVocabulary> vocabulary,
                                                                  int64_t max_work) {
  if (grammar->size() > kMaxItems) {
    return invalid_argument("the grammar has " + std::to_string(grammar->size()) + " items, over the limit of " +
                            std::to_string(kMaxItems));
  }
  const auto started = std::chrono::steady_clock::now();
  std::shared_ptr<TokenGrammar> tg(new TokenGrammar());
  tg->grammar_ = grammar;
  tg->vocabulary_ = vocabulary;
  const CompiledGrammar& g = *grammar;
  const TokenVocabulary& vocab = *vocabulary;
  const std::vector<ByteSet> follow = follow_sets(g);
  StateSpace follow_space(grammar, return_positions(g));
  const std::vector<bool> reachable = reachable_rules(g);
  const std::span<const TokenVocabulary::TrieNode> trie = vocab.trie();
  const std::span<const int32_t> sorted = vocab.sorted();

  StateSpace space(grammar);
  size_t max_depth = 0;
  for (const TokenVocabulary::TrieNode& node : trie) max_depth = std::max(max_depth, static_cast<size_t>(node.depth));
  std::vector<int32_t> state(max_depth + 1), escapes_in_effect(max_depth + 1), escapes(max_depth + 1);
  std::unordered_map<std::string_view, int32_t> suffix_ids;  // -1: no continuation of the rule takes it
  std::vector<int32_t> continuations(g.grammar().rules.size(), -1);  // by rule: follow_space.after_rule

  tg->position_of_.assign(static_cast<size_t>(g.size()), -1);
  for (int32_t pos = 0; pos < g.size(); ++pos) {
    if (g.item(pos).set < 0 || !reachable[static_cast<size_t>(g.rule_of(pos))]) continue;
    const size_t rule = static_cast<size_t>(g.rule_of(pos));
    const ByteSet& after_rule = follow[rule];
    if (continuations[rule] < 0) continuations[rule] = follow_space.after_rule(static_cast<int32_t>(rule));
    // Whether what can follow the rule anywhere in the grammar could take `suffix`: a necessary
    // condition for the suffix to match in the real context.
    auto may_follow = [&](std::string_view suffix) {
      return follow_space.next(continuations[rule], suffix) != StateSpace::kDead;
    };
    Position out;
    suffix_ids.clear();
    // The tokens under trie node `node` are uncertain, with one suffix per escape in effect.
    auto uncertain = [&](const TokenVocabulary::TrieNode& node, int32_t n) {
      for (int32_t j = node.lo; j < node.hi; ++j) {
        const int32_t id = sorted[static_cast<size_t>(j)];
        const std::string& bytes = vocab.bytes(id);
        for (int32_t e = 0; e < n; ++e) {
          const std::string_view suffix = std::string_view(bytes).substr(static_cast<size_t>(escapes[static_cast<size_t>(e)]));
          auto [it, added] = suffix_ids.emplace(suffix, -1);
          if (added && may_follow(suffix)) {
            it->second = static_cast<int32_t>(out.suffixes.size());
            out.suffixes.emplace_back(suffix);
          }
          if (it->second < 0) continue;
          out.uncertain_ids.push_back(id);
          out.uncertain_suffixes.push_back(it->second);
        }
      }
      tg->stats_.work += node.hi - node.lo;
    };
    // Depth-first over the trie (its nodes are in that order), with the state after each prefix
    // and the depths where the position's rule could end with the next byte able to follow it.
    state[0] = space.at(pos);
    escapes_in_effect[0] = 0;
    for (size_t i = 1; i < trie.size();) {
      const TokenVocabulary::TrieNode& node = trie[i];
      const size_t d = static_cast<size_t>(node.depth);
      const int32_t before = state[d - 1];
      int32_t n = escapes_in_effect[d - 1];
      if (space.ended(before) && after_rule.has(node.byte)) escapes[static_cast<size_t>(n++)] = static_cast<int32_t>(d - 1);
      escapes_in_effect[d] = n;
      ++tg->stats_.work;
      const int32_t s = space.next(before, node.byte);
      if (s == StateSpace::kDead) {
        if (n > 0) uncertain(node, n);
        i = static_cast<size_t>(node.next);
        continue;
      }
      state[d] = s;
      for (int32_t j = node.lo; j < node.mid; ++j) out.accepted_ids.push_back(sorted[static_cast<size_t>(j)]);
      ++i;
    }
    if (tg->stats_.work > max_work) {
      return invalid_argument("the grammar is too large to compile against the vocabulary (over " +
                              std::to_string(max_work) + " steps)");
    }
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count() > kMaxSeconds) {
      return invalid_argument("the grammar is too large to compile against the vocabulary (over " +
                              std::to_string(static_cast<int>(kMaxSeconds)) + " s)");
    }
    std::sort(out.accepted_ids.begin(), out.accepted_ids.end());
    if (out.accepted_ids.size() * 32 > static_cast<size_t>(vocab.size())) {
      out.accepted_bits.assign(vocab.mask_words(), 0);
      for (int32_t id : out.accepted_ids) out.accepted_bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
      out.accepted_ids = {};
    }
    tg->stats_.positions += 1;
    tg->stats_.accepted += static_cast<int64_t>(out.accepted_ids.size());
    tg->stats_.uncertain += static_cast<int64_t>(out.uncertain_ids.size());
    tg->stats_.suffixes += static_cast<int64_t>(out.suffixes.size());
    tg->position_of_[static_cast<size_t>(pos)] = static_cast<int32_t>(tg->positions_.size());
    tg->positions_.push_back(std::move(out));
  }
  return std::shared_ptr<const TokenGrammar>(std::move(tg));
}

TokenMatcher::TokenMatcher(std::shared_ptr<const TokenGrammar> grammar, bool starts_text,
                           std::span<const int32_t> stop_ids)
    : grammar_(std::move(grammar)),
      vocab_(&grammar_->vocabulary()),
      space_(grammar_->grammar()),
      strip_first_space_(starts_text && vocab_->strips_leading_space()),
      stop_ids_(vocab_->stop_ids()) {
  for (int32_t id : stop_ids) {
    if (id >= 0 && id < vocab_->size()) stop_ids_.push_back(id);
  }
  std::sort(stop_ids_.begin(), stop_ids_.end());
  stop_ids_.erase(std::unique(stop_ids_.begin(), stop_ids_.end()), stop_ids_.end());
  history_.push_back(space_.root());
}

std::string_view TokenMatcher::token_text(int32_t token) const {
  std::string_view bytes = vocab_->bytes(token);
  if (strip_first_space_ && accepted() == 0 && !bytes.empty() && bytes[0] == ' ') bytes.remove_prefix(1);
  return bytes;
}

const std::vector<int32_t>& TokenMatcher::context_accepted(int32_t node) {
  auto [it, added] = context_accepted_.try_emplace(node);
  if (!added) return it->second;
  const TokenGrammar::Position& p = grammar_->position(space_.node(node).pos);
  const int32_t after = space_.after(node);
  std::vector<uint8_t> ok(p.suffixes.size());
  for (size_t s = 0; s < p.suffixes.size(); ++s) ok[s] = space_.next(after, p.suffixes[s]) != StateSpace::kDead;
  std::vector<int32_t> ids;
  for (size_t u = 0; u < p.uncertain_ids.size(); ++u) {
    if (ok[static_cast<size_t>(p.uncertain_suffixes[u])]) ids.push_back(p.uncertain_ids[u]);
  }
  it->second = std::move(ids);
  return it->second;
}

void TokenMatcher::fill_mask(std::span<uint64_t> mask) {
  std::fill(mask.begin(), mask.end(), 0);
  auto set = [&](int32_t id) { mask[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64); };
  const int32_t s = state();
  // Stop tokens are stops only (a request's stop id may be a token with text): allowed exactly
  // where the text can end.
  const bool can_stop = stopped_ || space_.ended(s);
  auto set_stops = [&] {
    for (int32_t id : stop_ids_) {
      uint64_t& w = mask[static_cast<size_t>(id) / 64];
      const uint64_t bit = uint64_t{1} << (id % 64);
      w = can_stop ? (w | bit) : (w & ~bit);
    }
  };
  if (stopped_) return set_stops();
  if (strip_first_space_ && accepted() == 0) {
    // The first token's leading space is dropped: check each token's text as it will be, from here.
    for (int32_t id : vocab_->sorted()) {
      const std::string_view text = token_text(id);
      if (!text.empty() && space_.next(s, text) != StateSpace::kDead) set(id);
    }
    return set_stops();
  }
  // (Checking uncertain tokens may add states, which moves what stacks() points into.)
  const std::span<const int32_t> stacks = space_.stacks(s);
  stacks_.assign(stacks.begin(), stacks.end());
  for (int32_t node : stacks_) {
    const TokenGrammar::Position& p = grammar_->position(space_.node(node).pos);
    if (!p.accepted_bits.empty()) {
      for (size_t w = 0; w < mask.size(); ++w) mask[w] |= p.accepted_bits[w];
    } else {
      for (int32_t id : p.accepted_ids) set(id);
    }
    if (!p.uncertain_ids.empty()) {
      for (int32_t id : context_accepted(node)) set(id);
    }
  }
  set_stops();
}

bool TokenMatcher::accept(int32_t token) {
  if (token < 0 || token >= vocab_->size()) return false;
  const int32_t s = state();
  if (std::binary_search(stop_ids_.begin(), stop_ids_.end(), token)) {
    if (!space_.ended(s) && !stopped_) return false;
    history_.push_back(s);
    if (!stopped_) stop_at_ = history_.size();
    stopped_ = true;
    return true;
  }
  if (stopped_) return false;
  const std::string_view text = token_text(token);
  if (text.empty()) return false;
  const int32_t next = space_.next(s, text);
  if (next == StateSpace::kDead) return false;
  history_.push_back(next);
  return true;
}

void TokenMatcher::rollback(size_t tokens) {
  history_.resize(history_.size() - std::min(tokens, accepted()));
  if (stopped_ && history_.size() < stop_at_) stopped_ = false;
}

}  // namespace pagoda::structured
