// UTF-8 utilities for the tokenizers: strict decoding (Unicode's "maximal subpart" rule for
// invalid input), replacement of invalid sequences by U+FFFD, the length of the part of a byte
// string that holds only complete characters, and GPT-2's byte <-> unicode mapping used by
// byte-level BPE vocabularies. Free functions on plain values: thread-safe.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace pagoda::unicode {

// One step of strict UTF-8 decoding at a position.
struct Utf8Step {
  char32_t code_point = 0;  // valid only when valid
  size_t length = 0;        // bytes consumed (>= 1 when the input is not empty)
  bool valid = false;       // a well-formed character
  bool truncated = false;   // !valid because the input ends inside a character that could
                            // still become well-formed with more bytes
};

// Decodes the character starting at s[pos] (pos < s.size()). An ill-formed sequence consumes
// its maximal subpart (at least one byte), as Unicode and WHATWG specify for replacement.
Utf8Step decode_utf8(std::string_view s, size_t pos);

// Appends the UTF-8 encoding of `cp` (U+FFFD for surrogates and values above U+10FFFF).
void append_utf8(char32_t cp, std::string& out);

// `s` with every ill-formed sequence (maximal subpart) replaced by U+FFFD.
std::string sanitize_utf8(std::string_view s);

// True when `s` is entirely well-formed UTF-8.
bool is_valid_utf8(std::string_view s);

// The length of the longest prefix of `s` that does not end inside a character that more bytes
// could still complete. sanitize_utf8(s) == sanitize_utf8(prefix) + sanitize_utf8(rest) holds
// for any later bytes appended to the rest.
size_t complete_utf8_prefix(std::string_view s);

// GPT-2's bytes_to_unicode(): the code point that byte-level BPE uses for each byte.
const std::array<char32_t, 256>& byte_to_code_point();
// The inverse: the byte of a code point of that table, or -1.
int code_point_to_byte(char32_t cp);

// "▁" (U+2581), SentencePiece's whitespace marker.
inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

// A SentencePiece piece's text as bytes: every kSpaceMarker becomes ' '.
std::string spm_piece_to_bytes(std::string_view text);

}  // namespace pagoda::unicode
