#include "tokenizer_checks.h"

#include <string>

#include "fuzz_support.h"

namespace pagoda::fuzz {

std::vector<TokenId> check_encode(const Tokenizer& tok, std::string_view text, bool real_vocab) {
  std::vector<TokenId> plain;
  for (bool add_special : {false, true}) {
    std::vector<TokenId> ids = tok.encode(text, add_special);
    for (TokenId id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
    // The whole text as one verbatim range: no special token may come out of it.
    const TextRange all{0, text.size()};
    for (TokenId id : tok.encode(text, add_special, std::span<const TextRange>(&all, 1))) {
      FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
      if (real_vocab && tok.is_special(id)) {
        // Only the ones add_special puts at the ends.
        FUZZ_CHECK(add_special && (id == tok.bos_id() || id == tok.eos_id()));
      }
    }
    check_decode(tok, ids);
    if (!add_special) plain = std::move(ids);
  }
  return plain;
}

void check_decode(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  for (bool skip_special : {false, true}) {
    const std::string whole = tok.decode(ids, skip_special);
    FUZZ_CHECK(is_valid_utf8(whole));
    IncrementalDetokenizer inc(tok, skip_special);
    std::string pieces;
    for (TokenId id : ids) {
      const std::string piece = inc.push(id);
      FUZZ_CHECK(is_valid_utf8(piece));
      pieces += piece;
    }
    const std::string tail = inc.flush();
    FUZZ_CHECK(is_valid_utf8(tail));
    pieces += tail;
    FUZZ_CHECK(pieces == whole);
  }
  for (TokenId id : ids) {
    (void)tok.token_bytes(id);
    if (id >= 0 && id < tok.vocab_size()) (void)tok.token_text(id);
  }
}

std::vector<TokenId> ids_from_bytes(std::string_view bytes, int64_t vocab_size) {
  std::vector<TokenId> ids;
  const uint64_t range = static_cast<uint64_t>(vocab_size) + 4;
  for (size_t i = 0; i + 4 <= bytes.size(); i += 4) {
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) v = (v << 8) | static_cast<uint8_t>(bytes[i + k]);
    ids.push_back(static_cast<TokenId>(static_cast<int64_t>(v % range) - 2));
  }
  return ids;
}

}  // namespace pagoda::fuzz
