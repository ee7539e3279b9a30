// Helpers shared by the structured-output tests.
#pragma once

#include <cstdint>
#include <string>

namespace pagoda::structured::testing {

// The tests' own UTF-8 encoder (the reference for the grammars' byte sequences, written apart from
// utf8_encode in grammar.cpp).
inline std::string utf8(uint32_t c) {
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  if (c < 0x800) return {static_cast<char>(0xC0 | (c >> 6)), static_cast<char>(0x80 | (c & 0x3F))};
  if (c < 0x10000) {
    return {static_cast<char>(0xE0 | (c >> 12)), static_cast<char>(0x80 | ((c >> 6) & 0x3F)),
            static_cast<char>(0x80 | (c & 0x3F))};
  }
  return {static_cast<char>(0xF0 | (c >> 18)), static_cast<char>(0x80 | ((c >> 12) & 0x3F)),
          static_cast<char>(0x80 | ((c >> 6) & 0x3F)), static_cast<char>(0x80 | (c & 0x3F))};
}

}  // namespace pagoda::structured::testing
