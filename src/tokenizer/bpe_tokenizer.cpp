#include "tokenizer/bpe_tokenizer.h"

#include <uninorm.h>

#include <cstdlib>

#include "tokenizer/unicode.h"

namespace pagoda {

const char* const kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

namespace {

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace

std::vector<std::string> pre_tokenizer_patterns(std::string_view pre) {
  if (pre == "gpt-2" || pre == "gpt2" || pre == "default" || pre.empty()) return {kGpt2Pattern};
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "smaug-bpe") {
    return {kLlama3Pattern};
  }
  if (pre == "qwen2" || pre == "qwen35") return {kQwen2Pattern};
  return {};
}

std::string BpeTokenizer::bytes_to_token_text(std::string_view bytes) {
  const auto& table = unicode::byte_to_code_point();
  std::string text;
  text.reserve(bytes.size() * 2);
  for (char c : bytes) unicode::append_utf8(table[static_cast<uint8_t>(c)], text);
  return text;
}

bool BpeTokenizer::token_text_to_bytes(std::string_view text, std::string& bytes) {
  bytes.clear();
  size_t pos = 0;
  while (pos < text.size()) {
    const unicode::Utf8Step step = unicode::decode_utf8(text, pos);
    const int byte = step.valid ? unicode::code_point_to_byte(step.code_point) : -1;
    if (byte < 0) return false;
    bytes.push_back(static_cast<char>(byte));
    pos += step.length;
  }
  return true;
}

BpeTokenizer::BpeTokenizer(VocabSpec spec, Options options)
    : VocabTokenizer(std::move(spec)), options_(std::move(options)) {
  const auto& table = unicode::byte_to_code_point();
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    unicode::append_utf8(table[static_cast<size_t>(b)], ch);
    byte_ids_[static_cast<size_t>(b)] = find(ch).value_or(-1);
  }
}

Result<std::unique_ptr<BpeTokenizer>> BpeTokenizer::create(VocabSpec spec, Options options) {
  PAGODA_RETURN_IF_ERROR(validate_vocab_spec(spec));
  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(spec), std::move(options)));
}

std::vector<std::string_view> BpeTokenizer::pre_tokenize(std::string_view text,
                                                         std::string& storage) const {
  if (options_.add_prefix_space && !text.empty() && text[0] != ' ') {
    storage.assign(1, ' ');
    storage.append(text);
    text = storage;
  }
  std::vector<std::string_view> pieces{text};
  std::vector<std::string_view> next;
  for (const Regex& regex : options_.splits) {
    next.clear();
    // Should PCRE2 run out of resources (pathological input), the unmatched rest of a piece
    // stays one pre-token, which the merge loop still handles in O(n log n).
    for (std::string_view piece : pieces) (void)split_isolated(regex, piece, next);
    pieces.swap(next);
  }
  return pieces;
}

namespace {
// The NFC form of valid UTF-8 text (libunistring); invalid UTF-8 is returned unchanged, as
// there is no canonical form to compose.
std::string nfc_normalize(std::string_view text) {
  size_t length = 0;
  uint8_t* composed = u8_normalize(UNINORM_NFC, reinterpret_cast<const uint8_t*>(text.data()),
                                   text.size(), nullptr, &length);
  if (!composed) return std::string(text);
  std::string out(reinterpret_cast<const char*>(composed), length);
  std::free(composed);
  return out;
}
}  // namespace

void BpeTokenizer::encode_text(std::string_view text, bool /*at_start*/,
                               std::vector<TokenId>& out) const {
  std::string normalized;
  if (options_.nfc) {
    normalized = nfc_normalize(text);
    text = normalized;
  }
  std::string storage;
  for (std::string_view word : pre_tokenize(text, storage)) encode_word(word, out);
}

void BpeTokenizer::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (options_.ignore_merges) {
    if (auto id = find(bytes_to_token_text(word))) {
      out.push_back(*id);
      return;
    }
  }
  std::vector<TokenId> symbols;
  symbols.reserve(word.size());
  for (char c : word) {
    const TokenId id = byte_ids_[static_cast<uint8_t>(c)];
    if (id >= 0) {
      symbols.push_back(id);
    } else if (spec().unk) {
      symbols.push_back(*spec().unk);  // a vocabulary without all 256 byte symbols
    }
  }
  merges_.apply(symbols);
  out.insert(out.end(), symbols.begin(), symbols.end());
}

}  // namespace pagoda
