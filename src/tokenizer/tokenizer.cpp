// IncrementalDetokenizer and the byte tokenizer of the embedded demo model.
#include "tokenizer/tokenizer.h"

#include "tokenizer/unicode.h"
#include "tokenizer/vocab_tokenizer.h"

namespace pagoda {

std::string IncrementalDetokenizer::push(TokenId id) {
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  std::string bytes = tokenizer_.token_bytes(id);
  if (bytes.empty()) return {};
  if (first_) {
    // The same rule as decode(): the first byte of the whole output, if a space, is dropped.
    first_ = false;
    if (tokenizer_.decode_strips_leading_space() && bytes[0] == ' ') bytes.erase(0, 1);
  }
  pending_ += bytes;
  const size_t complete = unicode::complete_utf8_prefix(pending_);
  if (complete == 0) return {};
  std::string out = unicode::sanitize_utf8(std::string_view(pending_).substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string IncrementalDetokenizer::flush() {
  std::string out = unicode::sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

namespace {

// Ids 0..255 are the bytes themselves; 256 and 257 are BOS and EOS.
class ByteTokenizer final : public Tokenizer {
 public:
  static constexpr TokenId kBos = 256;
  static constexpr TokenId kEos = 257;

  std::vector<TokenId> encode(std::string_view text, bool add_special) const override {
    return encode(text, add_special, {});
  }

  std::vector<TokenId> encode(std::string_view text, bool add_special,
                              std::span<const TextRange> verbatim) const override {
    std::vector<TokenId> out;
    out.reserve(text.size() + 1);
    if (add_special) out.push_back(kBos);
    size_t pos = 0;
    while (pos < text.size()) {
      // "<s>" and "</s>" written in the text are the special tokens, as with other vocabularies,
      // except inside verbatim text, where they are their bytes.
      if (text.compare(pos, 3, "<s>") == 0 && !overlaps_any(verbatim, pos, pos + 3)) {
        out.push_back(kBos);
        pos += 3;
      } else if (text.compare(pos, 4, "</s>") == 0 && !overlaps_any(verbatim, pos, pos + 4)) {
        out.push_back(kEos);
        pos += 4;
      } else {
        out.push_back(static_cast<uint8_t>(text[pos++]));
      }
    }
    return out;
  }

  std::vector<std::string> special_token_texts() const override { return {"<s>", "</s>"}; }

  std::string decode(std::span<const TokenId> ids, bool skip_special) const override {
    std::string raw;
    for (TokenId id : ids) {
      if (id < 0 || id > kEos || (skip_special && id >= kBos)) continue;
      raw += token_bytes(id);
    }
    return unicode::sanitize_utf8(raw);
  }

  std::string token_bytes(TokenId id) const override {
    if (id >= 0 && id < 256) return std::string(1, static_cast<char>(id));
    if (id == kBos) return "<s>";
    if (id == kEos) return "</s>";
    return {};
  }

  std::string token_text(TokenId id) const override {
    if (id >= 0x21 && id <= 0x7E) return std::string(1, static_cast<char>(id));
    if (id >= 0 && id < 256) {
      static const char* kHex = "0123456789ABCDEF";
      return std::string("<0x") + kHex[id >> 4] + kHex[id & 15] + ">";
    }
    return token_bytes(id);
  }

  int64_t vocab_size() const override { return 258; }
  std::optional<TokenId> bos_id() const override { return kBos; }
  std::optional<TokenId> eos_id() const override { return kEos; }
  std::vector<TokenId> stop_ids() const override { return {kEos}; }
  bool is_special(TokenId id) const override { return id == kBos || id == kEos; }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace pagoda
