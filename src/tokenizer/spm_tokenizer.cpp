#include "tokenizer/spm_tokenizer.h"

#include <queue>

#include "tokenizer/unicode.h"

namespace pagoda {

int parse_byte_token(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  int value = 0;
  for (char c : text.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

SpmTokenizer::SpmTokenizer(VocabSpec spec, Options options)
    : VocabTokenizer(std::move(spec)), options_(options) {
  byte_ids_.fill(-1);
  for (size_t id = 0; id < this->spec().texts.size(); ++id) {
    const int byte = parse_byte_token(this->spec().texts[id]);
    // The first <0xXX> entry of each byte wins (files list them once, in order).
    if (byte >= 0 && byte_ids_[static_cast<size_t>(byte)] < 0) {
      byte_ids_[static_cast<size_t>(byte)] = static_cast<TokenId>(id);
    }
  }
}

Result<std::unique_ptr<SpmTokenizer>> SpmTokenizer::create_scored(VocabSpec spec,
                                                                 std::vector<float> scores,
                                                                 Options options) {
  PAGODA_RETURN_IF_ERROR(validate_vocab_spec(spec));
  if (scores.size() != spec.texts.size()) {
    return data_loss(spec.source + ": " + std::to_string(scores.size()) + " token scores for " +
                     std::to_string(spec.texts.size()) + " tokens");
  }
  std::unique_ptr<SpmTokenizer> tok(new SpmTokenizer(std::move(spec), options));
  tok->scored_ = true;
  tok->scores_ = std::move(scores);
  return tok;
}

Result<std::unique_ptr<SpmTokenizer>> SpmTokenizer::create_ranked(VocabSpec spec,
                                                                 Options options) {
  PAGODA_RETURN_IF_ERROR(validate_vocab_spec(spec));
  return std::unique_ptr<SpmTokenizer>(new SpmTokenizer(std::move(spec), options));
}

std::string SpmTokenizer::escape_spaces(std::string_view text, bool at_start) const {
  std::string s;
  s.reserve(text.size() + 8);
  bool prefix = false;
  switch (options_.prefix) {
    case Prefix::kNever: break;
    case Prefix::kAlways: prefix = true; break;
    case Prefix::kUnlessMarked: prefix = !text.starts_with(' '); break;
    case Prefix::kFirstUnlessMarked: prefix = at_start && !text.starts_with(' '); break;
  }
  if (prefix) s.append(unicode::kSpaceMarker);
  for (char c : text) {
    if (c == ' ') {
      s.append(unicode::kSpaceMarker);
    } else {
      s.push_back(c);
    }
  }
  return s;
}

void SpmTokenizer::encode_text(std::string_view text, bool at_start,
                               std::vector<TokenId>& out) const {
  if (text.empty()) return;
  const std::string s = escape_spaces(text, at_start);
  if (!options_.split_words) {
    if (scored_) {
      encode_scored(s, out);
    } else {
      encode_ranked(s, out);
    }
    return;
  }
  // Each word starts at a "▁" (the marker joins the text after it).
  size_t begin = 0;
  while (begin < s.size()) {
    size_t end = s.find(unicode::kSpaceMarker, begin + 1);
    if (end == std::string::npos) end = s.size();
    const std::string word = s.substr(begin, end - begin);
    if (scored_) {
      encode_scored(word, out);
    } else {
      encode_ranked(word, out);
    }
    begin = end;
  }
}

void SpmTokenizer::append_fallback(std::string_view piece, std::vector<TokenId>& out) const {
  if (options_.byte_fallback) {
    bool all_bytes = true;
    for (char c : piece) all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(c)] >= 0;
    if (all_bytes) {
      for (char c : piece) out.push_back(byte_ids_[static_cast<uint8_t>(c)]);
      return;
    }
  }
  if (!spec().unk) return;  // nothing to stand for it: the text is dropped, as HF does
  if (options_.fuse_unk && !out.empty() && out.back() == *spec().unk) return;
  out.push_back(*spec().unk);
}

void SpmTokenizer::encode_ranked(const std::string& s, std::vector<TokenId>& out) const {
  // Symbols are token ids from the start, so that merging is a lookup of id pairs.
  std::vector<TokenId> symbols;
  symbols.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t len = unicode::decode_utf8(s, pos).length;
    const std::string_view ch(s.data() + pos, len);
    if (auto id = find(ch)) {
      symbols.push_back(*id);
    } else {
      append_fallback(ch, symbols);
    }
    pos += len;
  }
  merges_.apply(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

void SpmTokenizer::encode_scored(const std::string& s, std::vector<TokenId>& out) const {
  // Symbols are byte ranges of `s`, adjacent in a linked list; merging two concatenates ranges.
  struct Symbol {
    int32_t prev, next;
    uint32_t start, len;  // len 0: merged into its left neighbour
  };
  std::vector<Symbol> symbols;
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t len = unicode::decode_utf8(s, pos).length;
    const auto index = static_cast<int32_t>(symbols.size());
    symbols.push_back({index - 1, index + 1, static_cast<uint32_t>(pos), static_cast<uint32_t>(len)});
    pos += len;
  }
  if (symbols.empty()) return;
  symbols.back().next = -1;

  struct Bigram {
    float score;
    int32_t left, right;
    uint32_t len;  // bytes of the merged text; a changed symbol makes the entry stale
  };
  // Highest score first; on ties the leftmost pair (llama.cpp's order).
  const auto worse = [](const Bigram& a, const Bigram& b) {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  };
  std::priority_queue<Bigram, std::vector<Bigram>, decltype(worse)> heap(worse);
  const auto consider = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[static_cast<size_t>(left)];
    const Symbol& r = symbols[static_cast<size_t>(right)];
    const uint32_t len = l.len + r.len;
    auto id = find(std::string_view(s.data() + l.start, len));
    if (!id) return;
    heap.push({scores_[static_cast<size_t>(*id)], left, right, len});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    consider(static_cast<int32_t>(i - 1), static_cast<int32_t>(i));
  }
  while (!heap.empty()) {
    const Bigram top = heap.top();
    heap.pop();
    Symbol& l = symbols[static_cast<size_t>(top.left)];
    Symbol& r = symbols[static_cast<size_t>(top.right)];
    if (l.len == 0 || r.len == 0 || l.next != top.right || l.len + r.len != top.len) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[static_cast<size_t>(r.next)].prev = top.left;
    consider(l.prev, top.left);
    consider(top.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
    const Symbol& sym = symbols[static_cast<size_t>(i)];
    const std::string_view piece(s.data() + sym.start, sym.len);
    if (auto id = find(piece)) {
      out.push_back(*id);
    } else {
      append_fallback(piece, out);
    }
  }
}

}  // namespace pagoda
