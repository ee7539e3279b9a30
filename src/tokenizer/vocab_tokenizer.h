// VocabTokenizer: what the vocabulary-based tokenizers (SentencePiece-style BPE, byte-level BPE)
// share: the token table, special-token bookkeeping, literal matching of added tokens in the
// input text, BOS/EOS framing, and decoding. Subclasses only turn a stretch of plain text into
// ids (encode_text). Built once by a loader; immutable afterwards, so thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace pagoda {

// What a vocabulary entry is (the GGUF token_type values, also used for tokenizer.json).
enum class TokenKind : uint8_t {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special: BOS, EOS, <|im_end|>, ...; skipped by decode(skip_special)
  kUserDefined = 4,  // an added token that is not special; matched literally, always decoded
  kUnused = 5,
  kByte = 6,         // <0xXX> byte-fallback token
};

// Plain description of a vocabulary, filled in by the loaders.
struct VocabSpec {
  std::string source;              // the file it came from, for messages
  std::vector<std::string> texts;  // per id, as written in the file
  std::vector<std::string> bytes;  // per id, the bytes it decodes to
  std::vector<TokenKind> kinds;    // per id
  std::vector<TokenId> literals;   // ids recognized literally in input text (added tokens)
  std::optional<TokenId> bos, eos, unk;
  std::vector<TokenId> prefix;     // added before the text when add_special (e.g. BOS)
  std::vector<TokenId> suffix;     // added after it when add_special (e.g. EOS)
  std::vector<TokenId> stop_ids;
  // SentencePiece decoding drops one leading space of the decoded text (the dummy prefix).
  bool strip_leading_space = false;
};

// True when [begin, end) shares a byte with one of `ranges` (sorted, non-overlapping).
bool overlaps_any(std::span<const TextRange> ranges, size_t begin, size_t end);

// Finds added tokens in text: leftmost match first, longest match at that position.
class LiteralMatcher {
 public:
  // `special` tokens are the ones split() does not match inside verbatim ranges.
  void add(std::string_view text, TokenId id, bool special = false);
  bool empty() const { return nodes_.size() <= 1; }

  struct Piece {
    std::string_view text;  // plain text when id < 0
    TokenId id = -1;
  };
  // `text` cut into plain stretches and matched tokens, in order; empty stretches are omitted.
  // A special token whose match would overlap a `verbatim` range (sorted, non-overlapping) is
  // not matched there; the longest other match at that position, if any, is taken instead.
  std::vector<Piece> split(std::string_view text, std::span<const TextRange> verbatim = {}) const;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> edges;  // sorted by byte
    TokenId id = -1;
    bool special = false;
  };
  int32_t child(int32_t node, uint8_t byte) const;
  std::vector<Node> nodes_ = std::vector<Node>(1);
  bool first_byte_[256] = {};
};

class VocabTokenizer : public Tokenizer {
 public:
  VocabTokenizer(const VocabTokenizer&) = delete;  // the index points into this object
  VocabTokenizer& operator=(const VocabTokenizer&) = delete;

  // Tokenizer's interface. encode() cuts out the added tokens first (leftmost, then longest
  // match), hands each stretch between them to encode_text(), and frames the result with
  // spec.prefix/suffix when add_special. decode() concatenates token bytes, skipping ids out of
  // range (and control/unknown tokens when skip_special), applies the leading-space rule, then
  // replaces ill-formed UTF-8.
  std::vector<TokenId> encode(std::string_view text, bool add_special) const final;
  std::vector<TokenId> encode(std::string_view text, bool add_special,
                              std::span<const TextRange> verbatim) const final;
  std::vector<std::string> special_token_texts() const final;
  std::string decode(std::span<const TokenId> ids, bool skip_special) const final;
  std::string token_bytes(TokenId id) const final;
  std::string token_text(TokenId id) const final;
  int64_t vocab_size() const final { return static_cast<int64_t>(spec_.texts.size()); }
  std::optional<TokenId> bos_id() const final { return spec_.bos; }
  std::optional<TokenId> eos_id() const final { return spec_.eos; }
  std::vector<TokenId> stop_ids() const final { return spec_.stop_ids; }
  bool is_special(TokenId id) const final;
  bool decode_strips_leading_space() const final { return spec_.strip_leading_space; }

  // The id of the entry whose file text is `text` (the last one when the file repeats it).
  std::optional<TokenId> find(std::string_view text) const;
  // The kind of entry `id` (which must be in range).
  TokenKind kind(TokenId id) const { return spec_.kinds[static_cast<size_t>(id)]; }
  // The description this tokenizer was built from.
  const VocabSpec& spec() const { return spec_; }

 protected:
  // Indexes `spec`, which must have passed validate_vocab_spec (checked).
  explicit VocabTokenizer(VocabSpec spec);

  // Appends the ids of a stretch of plain text (no added tokens inside), which is never empty;
  // at_start: the stretch begins the input text.
  virtual void encode_text(std::string_view text, bool at_start,
                           std::vector<TokenId>& out) const = 0;

 private:
  VocabSpec spec_;
  std::unordered_map<std::string_view, TokenId> text_to_id_;  // views into spec_.texts
  LiteralMatcher literals_;
};

// Checks a VocabSpec: per-id arrays of equal length, every id it refers to in range. The
// error (kDataLoss) names spec.source.
Status validate_vocab_spec(const VocabSpec& spec);

// Ids of well-known end-of-generation tokens ("<|eot_id|>", "<|im_end|>", ...) present in the
// spec as special tokens, merged into `ids` without duplicates.
void add_known_stop_tokens(const VocabSpec& spec, std::vector<TokenId>& ids);

}  // namespace pagoda
