// Invariants every tokenizer keeps on any text and any ids (shared by the fuzz targets that
// build a tokenizer): ids inside the vocabulary, decoded text valid UTF-8, and the incremental
// detokenizer's pieces concatenating to decode() of the same ids.
#pragma once

#include <cstdint>
#include <string_view>

#include "tokenizer/tokenizer.h"

namespace pagoda::fuzz {

// Text with ASCII, two- and three-byte characters, digits, whitespace runs and special-token
// look-alikes, for targets whose input is the vocabulary rather than the text.
inline constexpr std::string_view kSampleText =
    "Hello world, 123 4567 <s></s><|endoftext|> \xC3\xA9t\xC3\xA9 \xE4\xB8\xAD\xE6\x96\x87\n\t  x "
    " ";

// Encodes `text` (with and without special tokens) and checks the ids and their decoding.
// With `real_vocab` (a vocabulary as models ship it, not a fuzzed one) also checks that text
// passed as verbatim yields no special token but the BOS / EOS that add_special puts there.
// Returns the ids of encode(text, false).
std::vector<TokenId> check_encode(const Tokenizer& tok, std::string_view text, bool real_vocab);

// Decodes `ids` (any values, in or out of the vocabulary) all at once and incrementally.
void check_decode(const Tokenizer& tok, const std::vector<TokenId>& ids);

// Token ids from raw bytes, 4 per id, reduced into [-2, vocab_size + 2) so that both valid and
// out-of-range ids occur.
std::vector<TokenId> ids_from_bytes(std::string_view bytes, int64_t vocab_size);

}  // namespace pagoda::fuzz
