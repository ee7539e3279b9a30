#include "tokenizer/vocab_tokenizer.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include "base/check.h"
#include "tokenizer/unicode.h"

namespace pagoda {

// ---- LiteralMatcher ------------------------------------------------------------------------

bool overlaps_any(std::span<const TextRange> ranges, size_t begin, size_t end) {
  // The first range that ends after `begin`; empty ranges cover nothing and are stepped over.
  auto it = std::partition_point(ranges.begin(), ranges.end(),
                                 [&](const TextRange& r) { return r.end <= begin; });
  for (; it != ranges.end() && it->begin < end; ++it) {
    if (it->begin < it->end) return true;
  }
  return false;
}

int32_t LiteralMatcher::child(int32_t node, uint8_t byte) const {
  const auto& edges = nodes_[static_cast<size_t>(node)].edges;
  auto it = std::lower_bound(edges.begin(), edges.end(), std::make_pair(byte, int32_t{-1}));
  return it != edges.end() && it->first == byte ? it->second : -1;
}

void LiteralMatcher::add(std::string_view text, TokenId id, bool special) {
  if (text.empty()) return;  // an empty token can never be matched
  int32_t node = 0;
  for (char c : text) {
    const auto byte = static_cast<uint8_t>(c);
    int32_t next = child(node, byte);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.emplace_back();
      auto& edges = nodes_[static_cast<size_t>(node)].edges;
      edges.insert(std::lower_bound(edges.begin(), edges.end(), std::make_pair(byte, int32_t{-1})),
                   {byte, next});
    }
    node = next;
  }
  // Two added tokens with the same text: the first one listed wins.
  Node& end = nodes_[static_cast<size_t>(node)];
  if (end.id < 0) {
    end.id = id;
    end.special = special;
  }
  first_byte_[static_cast<uint8_t>(text[0])] = true;
}

std::vector<LiteralMatcher::Piece> LiteralMatcher::split(std::string_view text,
                                                         std::span<const TextRange> verbatim) const {
  std::vector<Piece> pieces;
  size_t plain_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    int32_t node = 0;
    TokenId best_id = -1;
    size_t best_len = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      node = child(node, static_cast<uint8_t>(text[i]));
      if (node < 0) break;
      const Node& n = nodes_[static_cast<size_t>(node)];
      if (n.id >= 0 && !(n.special && overlaps_any(verbatim, pos, i + 1))) {
        best_id = n.id;
        best_len = i + 1 - pos;
      }
    }
    if (best_id < 0) {
      ++pos;
      continue;
    }
    if (pos > plain_start) pieces.push_back({text.substr(plain_start, pos - plain_start), -1});
    pieces.push_back({{}, best_id});
    pos += best_len;
    plain_start = pos;
  }
  if (plain_start < text.size()) pieces.push_back({text.substr(plain_start), -1});
  return pieces;
}

// ---- VocabSpec -----------------------------------------------------------------------------

Status validate_vocab_spec(const VocabSpec& spec) {
  const size_t n = spec.texts.size();
  const auto fail = [&](const std::string& what) {
    return data_loss(spec.source + ": " + what);
  };
  if (n == 0) return fail("the vocabulary is empty");
  if (n > static_cast<size_t>(std::numeric_limits<TokenId>::max())) {
    return fail("the vocabulary has too many tokens (" + std::to_string(n) + ")");
  }
  if (spec.bytes.size() != n || spec.kinds.size() != n) {
    return fail("token arrays differ in length");
  }
  const auto in_range = [&](TokenId id) { return id >= 0 && static_cast<size_t>(id) < n; };
  const auto check_id = [&](std::optional<TokenId> id, const char* what) -> Status {
    if (id && !in_range(*id)) {
      return fail(std::string(what) + " id " + std::to_string(*id) +
                  " is outside the vocabulary of " + std::to_string(n) + " tokens");
    }
    return {};
  };
  PAGODA_RETURN_IF_ERROR(check_id(spec.bos, "BOS"));
  PAGODA_RETURN_IF_ERROR(check_id(spec.eos, "EOS"));
  PAGODA_RETURN_IF_ERROR(check_id(spec.unk, "unknown-token"));
  for (const auto* list : {&spec.literals, &spec.prefix, &spec.suffix, &spec.stop_ids}) {
    for (TokenId id : *list) PAGODA_RETURN_IF_ERROR(check_id(id, "special token"));
  }
  return {};
}

void add_known_stop_tokens(const VocabSpec& spec, std::vector<TokenId>& ids) {
  // Chat models end a turn with one of these rather than (only) with their EOS token.
  static constexpr std::string_view kStopTexts[] = {
      "<|eot_id|>",  "<|eom_id|>",     "<|end_of_text|>", "<|im_end|>",
      "<|endoftext|>", "<end_of_turn>", "<|end|>",         "<EOT>",
  };
  for (TokenId id : spec.literals) {
    if (spec.kinds[static_cast<size_t>(id)] != TokenKind::kControl) continue;
    const std::string& text = spec.texts[static_cast<size_t>(id)];
    if (std::find(std::begin(kStopTexts), std::end(kStopTexts), text) == std::end(kStopTexts)) {
      continue;
    }
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
}

// ---- VocabTokenizer ------------------------------------------------------------------------

VocabTokenizer::VocabTokenizer(VocabSpec spec) : spec_(std::move(spec)) {
  PAGODA_CHECK(validate_vocab_spec(spec_).ok());
  text_to_id_.reserve(spec_.texts.size());
  for (size_t id = 0; id < spec_.texts.size(); ++id) {
    text_to_id_[spec_.texts[id]] = static_cast<TokenId>(id);
  }
  for (TokenId id : spec_.literals) literals_.add(spec_.texts[static_cast<size_t>(id)], id, is_special(id));
}

std::optional<TokenId> VocabTokenizer::find(std::string_view text) const {
  auto it = text_to_id_.find(text);
  if (it == text_to_id_.end()) return std::nullopt;
  return it->second;
}

std::vector<TokenId> VocabTokenizer::encode(std::string_view text, bool add_special) const {
  return encode(text, add_special, {});
}

std::vector<TokenId> VocabTokenizer::encode(std::string_view text, bool add_special,
                                            std::span<const TextRange> verbatim) const {
  std::vector<TokenId> out;
  if (add_special) out.insert(out.end(), spec_.prefix.begin(), spec_.prefix.end());
  if (literals_.empty()) {
    if (!text.empty()) encode_text(text, true, out);
  } else {
    // A special token refused inside a verbatim range stays part of the plain stretch around
    // it, so that stretch is tokenized in one piece, exactly as if the token did not exist.
    for (const LiteralMatcher::Piece& piece : literals_.split(text, verbatim)) {
      if (piece.id >= 0) {
        out.push_back(piece.id);
      } else {
        encode_text(piece.text, piece.text.data() == text.data(), out);
      }
    }
  }
  if (add_special) out.insert(out.end(), spec_.suffix.begin(), spec_.suffix.end());
  return out;
}

std::vector<std::string> VocabTokenizer::special_token_texts() const {
  // The first literal listed with a given text is the one the matcher knows (see add()).
  std::vector<std::string> texts;
  std::unordered_set<std::string_view> seen;
  for (TokenId id : spec_.literals) {
    const std::string& text = spec_.texts[static_cast<size_t>(id)];
    if (text.empty() || !seen.insert(text).second) continue;
    if (is_special(id)) texts.push_back(text);
  }
  return texts;
}

bool VocabTokenizer::is_special(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= spec_.kinds.size()) return false;
  const TokenKind k = spec_.kinds[static_cast<size_t>(id)];
  return k == TokenKind::kControl || k == TokenKind::kUnknown;
}

std::string VocabTokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string raw;
  for (TokenId id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= spec_.bytes.size()) continue;
    if (skip_special && is_special(id)) continue;
    raw += spec_.bytes[static_cast<size_t>(id)];
  }
  if (spec_.strip_leading_space && !raw.empty() && raw[0] == ' ') raw.erase(0, 1);
  return unicode::sanitize_utf8(raw);
}

std::string VocabTokenizer::token_bytes(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= spec_.bytes.size()) return {};
  return spec_.bytes[static_cast<size_t>(id)];
}

std::string VocabTokenizer::token_text(TokenId id) const {
  if (id < 0 || static_cast<size_t>(id) >= spec_.texts.size()) return {};
  return spec_.texts[static_cast<size_t>(id)];
}

}  // namespace pagoda
