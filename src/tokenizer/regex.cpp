#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include "tokenizer/unicode.h"

namespace pagoda {

struct Regex::Code {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Code() { pcre2_code_free(code); }
};

Result<Regex> Regex::compile(std::string_view pattern, bool literal) {
  int error = 0;
  PCRE2_SIZE error_offset = 0;
  // PCRE2_LITERAL allows only a few other options; UCP (meaningless for a literal) is not one.
  uint32_t options = PCRE2_UTF | PCRE2_MATCH_INVALID_UTF;
  options |= literal ? PCRE2_LITERAL : PCRE2_UCP;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                   options, &error, &error_offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return invalid_argument("bad regex /" + std::string(pattern) + "/ at offset " +
                            std::to_string(error_offset) + ": " +
                            reinterpret_cast<const char*>(message));
  }
  auto shared = std::make_shared<Code>();
  shared->code = code;
  // JIT is an optimization only: where it is unavailable the interpreter runs instead.
  shared->jit = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  Regex regex;
  regex.code_ = std::move(shared);
  regex.pattern_ = std::string(pattern);
  return regex;
}

bool Regex::find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  if (md == nullptr) return false;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  bool ok = true;
  size_t offset = 0;
  uint32_t no_jit = 0;
  while (offset <= text.size()) {
    int rc = pcre2_match(code_->code, subject, text.size(), offset, no_jit, md, nullptr);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && no_jit == 0) {
      // The JIT's stack is small; the interpreter keeps its backtracking state on the heap.
      no_jit = PCRE2_NO_JIT;
      continue;
    }
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      ok = false;
      break;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    const size_t begin = ov[0], end = ov[1];
    if (end > begin) {
      out.emplace_back(begin, end);
      offset = end;
    } else {
      // An empty match: step over one character so the loop always advances.
      if (begin >= text.size()) break;
      offset = begin + unicode::decode_utf8(text, begin).length;
    }
  }
  pcre2_match_data_free(md);
  return ok;
}

bool split_isolated(const Regex& regex, std::string_view text, std::vector<std::string_view>& out) {
  std::vector<std::pair<size_t, size_t>> matches;
  const bool ok = regex.find_all(text, matches);
  size_t pos = 0;
  for (const auto& [begin, end] : matches) {
    if (begin > pos) out.push_back(text.substr(pos, begin - pos));
    out.push_back(text.substr(begin, end - begin));
    pos = end;
  }
  if (pos < text.size()) out.push_back(text.substr(pos));
  return ok;
}

}  // namespace pagoda
