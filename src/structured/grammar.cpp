#include "structured/grammar.h"

#include <algorithm>
#include <cstdio>

#include "tokenizer/unicode.h"

namespace pagoda::structured {
namespace {

constexpr uint32_t kMaxCodePoint = 0x10FFFF;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;

}  // namespace

std::string utf8_encode(uint32_t c) {
  std::string s;
  unicode::append_utf8(static_cast<char32_t>(c), s);
  return s;
}

namespace {

using ByteRanges = std::vector<std::pair<uint8_t, uint8_t>>;  // one range per byte of a sequence

// The code points [lo, hi] as sequences of byte ranges, each sequence matching exactly a
// contiguous block of them: split first by encoded length and around the surrogates, then until
// lo and hi differ only in bytes whose ranges below them are full (0x80-0xBF continuations).
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<ByteRanges>& out) {
  if (lo > hi) return;
  if (lo <= kSurrogateHi && hi >= kSurrogateLo) {
    if (lo < kSurrogateLo) utf8_sequences(lo, kSurrogateLo - 1, out);
    if (hi > kSurrogateHi) utf8_sequences(kSurrogateHi + 1, hi, out);
    return;
  }
  for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= edge && hi > edge) {
      utf8_sequences(lo, edge, out);
      utf8_sequences(edge + 1, hi, out);
      return;
    }
  }
  if (hi < 0x80) {
    out.push_back({{static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)}});
    return;
  }
  for (int i = 1; i < 4; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;  // the low i continuation bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const std::string a = utf8_encode(lo), b = utf8_encode(hi);
  ByteRanges seq;
  for (size_t k = 0; k < a.size(); ++k) seq.emplace_back(static_cast<uint8_t>(a[k]), static_cast<uint8_t>(b[k]));
  out.push_back(std::move(seq));
}

std::string byte_set_text(const ByteSet& set) {
  std::string s = "[";
  char buf[16];
  for (int b = 0; b < 256;) {
    if (!set.has(static_cast<uint8_t>(b))) {
      ++b;
      continue;
    }
    int e = b;
    while (e + 1 < 256 && set.has(static_cast<uint8_t>(e + 1))) ++e;
    std::snprintf(buf, sizeof buf, "\\x%02X", b);
    s += buf;
    if (e > b) {
      std::snprintf(buf, sizeof buf, "-\\x%02X", e);
      s += buf;
    }
    b = e + 1;
  }
  return s + "]";
}

}  // namespace

std::vector<std::pair<uint32_t, uint32_t>> complement_code_points(std::vector<std::pair<uint32_t, uint32_t>> ranges) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<uint32_t, uint32_t>> out;
  uint32_t next = 0;  // the first code point not yet covered or emitted
  bool done = false;
  for (const auto& [lo, hi] : ranges) {
    if (done) break;
    if (lo > next) out.emplace_back(next, lo - 1);
    if (hi >= kMaxCodePoint) {
      done = true;
    } else {
      next = std::max(next, hi + 1);
    }
  }
  if (!done && next <= kMaxCodePoint) out.emplace_back(next, kMaxCodePoint);
  return out;
}

std::string Grammar::to_string() const {
  std::string s;
  for (size_t r = 0; r < rules.size(); ++r) {
    s += rules[r].name + " ::=";
    for (size_t a = 0; a < rules[r].alternatives.size(); ++a) {
      if (a > 0) s += " |";
      for (const Element& e : rules[r].alternatives[a]) {
        s += " ";
        s += e.kind == Element::Kind::kRule ? rules[static_cast<size_t>(e.index)].name
                                            : byte_set_text(byte_sets[static_cast<size_t>(e.index)]);
      }
      if (rules[r].alternatives[a].empty()) s += " \"\"";
    }
    s += "\n";
  }
  return s;
}

int32_t GrammarBuilder::rule(const std::string& name) {
  auto [it, added] = by_name_.emplace(name, static_cast<int32_t>(rules_.size()));
  if (added) rules_.push_back(Rule{name, {}});
  return it->second;
}

int32_t GrammarBuilder::fresh_rule(const std::string& hint) {
  while (true) {
    const std::string name = hint + "-" + std::to_string(++fresh_);
    if (!by_name_.count(name)) return rule(name);
  }
}

void GrammarBuilder::add_alternative(int32_t rule, Alternative alt) {
  rules_[static_cast<size_t>(rule)].alternatives.push_back(std::move(alt));
}

Element GrammarBuilder::bytes(const ByteSet& set) {
  // Sets repeat (every literal's bytes): share them.
  for (size_t i = sets_.size(); i-- > 0 && i + 64 >= sets_.size();) {
    if (sets_[i] == set) return Element{Element::Kind::kBytes, static_cast<int32_t>(i)};
  }
  sets_.push_back(set);
  return Element{Element::Kind::kBytes, static_cast<int32_t>(sets_.size() - 1)};
}

Element GrammarBuilder::byte(uint8_t b) {
  ByteSet set;
  set.add(b);
  return bytes(set);
}

Alternative GrammarBuilder::literal(std::string_view text) {
  Alternative alt;
  for (char c : text) alt.push_back(byte(static_cast<uint8_t>(c)));
  return alt;
}

Element GrammarBuilder::code_points(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, const std::string& hint) {
  std::vector<ByteRanges> seqs;
  for (auto [lo, hi] : ranges) utf8_sequences(lo, std::min(hi, kMaxCodePoint), seqs);
  const int32_t r = fresh_rule(hint);
  // One-byte characters share one alternative of one set.
  ByteSet ascii;
  for (const ByteRanges& seq : seqs) {
    if (seq.size() == 1) ascii.add_range(seq[0].first, seq[0].second);
  }
  if (!ascii.empty()) add_alternative(r, {bytes(ascii)});
  for (const ByteRanges& seq : seqs) {
    if (seq.size() == 1) continue;
    Alternative alt;
    for (auto [lo, hi] : seq) {
      ByteSet set;
      set.add_range(lo, hi);
      alt.push_back(bytes(set));
    }
    add_alternative(r, std::move(alt));
  }
  return ref(r);
}

Element GrammarBuilder::repeat(const Alternative& item, int64_t min, int64_t max, const std::string& hint) {
  const int32_t r = fresh_rule(hint);
  if (min > kMaxRepeat || max > kMaxRepeat) {
    if (error_.empty()) {
      error_ = "a repetition of " + std::to_string(std::max(min, max)) + " is over the limit of " +
               std::to_string(kMaxRepeat);
    }
    return ref(r);
  }
  Alternative head;
  for (int64_t i = 0; i < min; ++i) head.insert(head.end(), item.begin(), item.end());
  if (max < 0) {
    // star ::= item star | ""
    const int32_t star = fresh_rule(hint + "-star");
    Alternative again = item;
    again.push_back(ref(star));
    add_alternative(star, std::move(again));
    add_alternative(star, {});
    head.push_back(ref(star));
  } else if (max > min) {
    // opt_k ::= item opt_(k-1) | "" with opt_0 ::= item | "": up to max - min more items.
    int32_t tail = -1;
    for (int64_t k = 0; k < max - min; ++k) {
      const int32_t opt = fresh_rule(hint + "-opt");
      Alternative more = item;
      if (tail >= 0) more.push_back(ref(tail));
      add_alternative(opt, std::move(more));
      add_alternative(opt, {});
      tail = opt;
    }
    head.push_back(ref(tail));
  }
  add_alternative(r, std::move(head));
  return ref(r);
}

Result<Grammar> GrammarBuilder::build(int32_t root, size_t max_rules) && {
  if (!error_.empty()) return invalid_argument(error_);
  if (rules_.size() > max_rules) {
    return invalid_argument("the grammar has " + std::to_string(rules_.size()) + " rules, over the limit of " +
                            std::to_string(max_rules));
  }
  const size_t n = rules_.size();
  for (const Rule& r : rules_) {
    if (r.alternatives.empty()) return invalid_argument("rule '" + r.name + "' is used but never defined");
  }
  // Productive rules (those matching some finite text), to a fixed point; an alternative that
  // needs an unproductive rule or an empty byte set can never complete, so it is dropped, and a
  // match that has started can then always be completed (token masks rely on it: no dead ends).
  std::vector<bool> productive(n, false);
  auto completes = [&](const Alternative& alt) {
    return std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
      return e.kind == Element::Kind::kRule ? productive[static_cast<size_t>(e.index)]
                                            : !sets_[static_cast<size_t>(e.index)].empty();
    });
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (productive[r]) continue;
      if (std::any_of(rules_[r].alternatives.begin(), rules_[r].alternatives.end(), completes)) {
        productive[r] = changed = true;
      }
    }
  }
  if (!productive[static_cast<size_t>(root)]) {
    return invalid_argument("rule '" + rules_[static_cast<size_t>(root)].name + "' matches no text");
  }
  for (Rule& r : rules_) std::erase_if(r.alternatives, [&](const Alternative& alt) { return !completes(alt); });
  // Nullable rules (those matching the empty string), to a fixed point.
  std::vector<bool> nullable(n, false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const Alternative& alt : rules_[r].alternatives) {
        const bool all = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
          return e.kind == Element::Kind::kRule && nullable[static_cast<size_t>(e.index)];
        });
        if (all) {
          nullable[r] = changed = true;
          break;
        }
      }
    }
  }
  // Left recursion: a cycle of rules each reachable at the start of the one before (after
  // nullable elements only). Depth-first over that graph, iteratively (grammars may be deep).
  std::vector<std::vector<int32_t>> starts(n);
  for (size_t r = 0; r < n; ++r) {
    for (const Alternative& alt : rules_[r].alternatives) {
      for (const Element& e : alt) {
        if (e.kind != Element::Kind::kRule) break;
        starts[r].push_back(e.index);
        if (!nullable[static_cast<size_t>(e.index)]) break;
      }
    }
  }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the path, 2 done
  std::vector<std::pair<int32_t, size_t>> path;
  for (size_t s = 0; s < n; ++s) {
    if (color[s] != 0) continue;
    path.emplace_back(static_cast<int32_t>(s), 0);
    color[s] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      const auto& edges = starts[static_cast<size_t>(r)];
      if (next == edges.size()) {
        color[static_cast<size_t>(r)] = 2;
        path.pop_back();
        continue;
      }
      const int32_t to = edges[next++];
      if (color[static_cast<size_t>(to)] == 1) {
        std::string cycle;
        bool on = false;
        for (const auto& [p, unused] : path) {
          on = on || p == to;
          if (on) cycle += rules_[static_cast<size_t>(p)].name + " -> ";
        }
        return invalid_argument("rule '" + rules_[static_cast<size_t>(to)].name +
                                "' is left-recursive (" + cycle + rules_[static_cast<size_t>(to)].name +
                                "); write the repetition on the right");
      }
      if (color[static_cast<size_t>(to)] == 0) {
        color[static_cast<size_t>(to)] = 1;
        path.emplace_back(to, 0);
      }
    }
  }
  Grammar g;
  g.rules = std::move(rules_);
  g.byte_sets = std::move(sets_);
  g.root = root;
  return g;
}

Grammar inline_small_rules(Grammar g) {
  constexpr size_t kMaxInlinedItems = 64, kMaxInlinedAlternatives = 16, kMaxAlternatives = 64;
  const size_t n = g.rules.size();
  // Strongly connected components of the references (Tarjan's, iteratively), which come out
  // callees first: a rule is rewritten after every rule it could inline.
  std::vector<int32_t> index(n, -1), low(n, 0), order;
  std::vector<bool> on_stack(n, false), recursive(n, false);
  std::vector<int32_t> stack;
  int32_t counter = 0;
  auto refs = [&](size_t r) {
    std::vector<int32_t> out;
    for (const Alternative& alt : g.rules[r].alternatives) {
      for (const Element& e : alt) {
        if (e.kind == Element::Kind::kRule) out.push_back(e.index);
      }
    }
    return out;
  };
  for (size_t s = 0; s < n; ++s) {
    if (index[s] >= 0) continue;
    std::vector<std::pair<int32_t, std::vector<int32_t>>> frames;  // rule, references left
    auto open = [&](int32_t r) {
      index[static_cast<size_t>(r)] = low[static_cast<size_t>(r)] = counter++;
      stack.push_back(r);
      on_stack[static_cast<size_t>(r)] = true;
      frames.emplace_back(r, refs(static_cast<size_t>(r)));
    };
    open(static_cast<int32_t>(s));
    while (!frames.empty()) {
      const int32_t r = frames.back().first;
      std::vector<int32_t>& left = frames.back().second;
      if (!left.empty()) {
        const int32_t to = left.back();
        left.pop_back();
        if (to == r) recursive[static_cast<size_t>(r)] = true;
        if (index[static_cast<size_t>(to)] < 0) {
          open(to);
        } else if (on_stack[static_cast<size_t>(to)]) {
          low[static_cast<size_t>(r)] = std::min(low[static_cast<size_t>(r)], index[static_cast<size_t>(to)]);
        }
        continue;
      }
      frames.pop_back();
      if (!frames.empty()) {
        const size_t up = static_cast<size_t>(frames.back().first);
        low[up] = std::min(low[up], low[static_cast<size_t>(r)]);
      }
      if (low[static_cast<size_t>(r)] == index[static_cast<size_t>(r)]) {
        std::vector<int32_t> component;
        int32_t m;
        do {
          m = stack.back();
          stack.pop_back();
          on_stack[static_cast<size_t>(m)] = false;
          component.push_back(m);
        } while (m != r);
        for (int32_t c : component) {
          if (component.size() > 1) recursive[static_cast<size_t>(c)] = true;
          order.push_back(c);
        }
      }
    }
  }
  std::vector<bool> inlinable(n, false);
  for (int32_t r : order) {
    Rule& rule = g.rules[static_cast<size_t>(r)];
    std::vector<Alternative> rewritten;
    for (Alternative& alt : rule.alternatives) {
      // Every choice of alternatives for the inlinable references, while the rule stays small.
      // A rule of several alternatives is written in only where it starts the alternative, so
      // that its copies part at their first byte; further in, the copies would share the prefix
      // before it and every one would be a parse stack of its own while that prefix matches.
      std::vector<Alternative> variants{Alternative{}};
      for (const Element& e : alt) {
        const size_t choices =
            e.kind == Element::Kind::kRule ? g.rules[static_cast<size_t>(e.index)].alternatives.size() : 0;
        const bool expand = e.kind == Element::Kind::kRule && inlinable[static_cast<size_t>(e.index)] &&
                            (choices == 1 || variants.front().empty()) &&
                            variants.size() * choices + rewritten.size() <= kMaxAlternatives;
        if (!expand) {
          for (Alternative& v : variants) v.push_back(e);
          continue;
        }
        std::vector<Alternative> next;
        for (const Alternative& v : variants) {
          for (const Alternative& inner : g.rules[static_cast<size_t>(e.index)].alternatives) {
            Alternative w = v;
            w.insert(w.end(), inner.begin(), inner.end());
            next.push_back(std::move(w));
          }
        }
        variants = std::move(next);
      }
      for (Alternative& v : variants) rewritten.push_back(std::move(v));
    }
    rule.alternatives = std::move(rewritten);
    size_t items = 0;
    for (const Alternative& alt : rule.alternatives) items += alt.size();
    inlinable[static_cast<size_t>(r)] = !recursive[static_cast<size_t>(r)] && r != g.root &&
                                        rule.alternatives.size() <= kMaxInlinedAlternatives &&
                                        items <= kMaxInlinedItems;
  }
  return g;
}

}  // namespace pagoda::structured
