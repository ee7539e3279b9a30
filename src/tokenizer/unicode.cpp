#include "tokenizer/unicode.h"

namespace pagoda::unicode {

Utf8Step decode_utf8(std::string_view s, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  Utf8Step step;
  const uint8_t b0 = byte(pos);
  if (b0 < 0x80) {
    step.code_point = b0;
    step.length = 1;
    step.valid = true;
    return step;
  }
  // The allowed range of the second byte depends on the lead byte (Unicode Table 3-7); all
  // later bytes are 80..BF.
  int need;
  uint8_t lo = 0x80, hi = 0xBF;
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    step.length = 1;  // a continuation byte or a byte that never starts a character
    return step;
  }
  size_t i = pos + 1;
  for (int k = 0; k < need; ++k, ++i) {
    if (i >= s.size()) {
      step.length = i - pos;
      step.truncated = true;
      return step;
    }
    const uint8_t b = byte(i);
    const uint8_t min = k == 0 ? lo : 0x80;
    const uint8_t max = k == 0 ? hi : 0xBF;
    if (b < min || b > max) {
      step.length = i - pos;
      return step;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  step.code_point = cp;
  step.length = i - pos;
  step.valid = true;
  return step;
}

void append_utf8(char32_t cp, std::string& out) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = 0xFFFD;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) {
    // Copy runs of ASCII without decoding them.
    size_t run = pos;
    while (run < s.size() && static_cast<uint8_t>(s[run]) < 0x80) ++run;
    out.append(s.substr(pos, run - pos));
    pos = run;
    if (pos >= s.size()) break;
    Utf8Step step = decode_utf8(s, pos);
    if (step.valid) {
      out.append(s.substr(pos, step.length));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    pos += step.length;
  }
  return out;
}

bool is_valid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    Utf8Step step = decode_utf8(s, pos);
    if (!step.valid) return false;
    pos += step.length;
  }
  return true;
}

size_t complete_utf8_prefix(std::string_view s) {
  // Only the last three bytes can belong to an unfinished character; back up to the latest
  // byte that could start one and see whether it is a valid-but-truncated prefix.
  const size_t begin = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t pos = s.size(); pos > begin;) {
    --pos;
    const uint8_t b = static_cast<uint8_t>(s[pos]);
    if (b < 0x80) return s.size();
    if (b >= 0xC0) {
      Utf8Step step = decode_utf8(s, pos);
      return step.truncated && pos + step.length == s.size() ? pos : s.size();
    }
  }
  return s.size();
}

namespace {

std::array<char32_t, 256> make_byte_table() {
  std::array<char32_t, 256> table{};
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) table[b] = direct[b] ? static_cast<char32_t>(b) : next++;
  return table;
}

}  // namespace

const std::array<char32_t, 256>& byte_to_code_point() {
  static const std::array<char32_t, 256> table = make_byte_table();
  return table;
}

int code_point_to_byte(char32_t cp) {
  // The table maps 0x21..0x7E, 0xA1..0xAC and 0xAE..0xFF to themselves and the other 68
  // bytes, in order, to 0x100..0x143.
  if ((cp >= 0x21 && cp <= 0x7E) || (cp >= 0xA1 && cp <= 0xAC) || (cp >= 0xAE && cp <= 0xFF)) {
    return static_cast<int>(cp);
  }
  if (cp >= 0x100 && cp < 0x100 + 68) {
    static const std::array<uint8_t, 68> shifted = [] {
      std::array<uint8_t, 68> t{};
      const auto& table = byte_to_code_point();
      for (int b = 0; b < 256; ++b) {
        if (table[b] >= 0x100) t[table[b] - 0x100] = static_cast<uint8_t>(b);
      }
      return t;
    }();
    return shifted[cp - 0x100];
  }
  return -1;
}

std::string spm_piece_to_bytes(std::string_view text) {
  std::string bytes;
  for (size_t pos = 0; pos < text.size();) {
    if (text.compare(pos, kSpaceMarker.size(), kSpaceMarker) == 0) {
      bytes.push_back(' ');
      pos += kSpaceMarker.size();
    } else {
      bytes.push_back(text[pos++]);
    }
  }
  return bytes;
}

}  // namespace pagoda::unicode
