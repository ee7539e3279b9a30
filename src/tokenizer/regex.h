// Regex: a compiled PCRE2 pattern (UTF-8, Unicode properties, JIT when available) used to cut
// text into pre-tokens. Input that is not valid UTF-8 is accepted: invalid bytes are never part
// of a match. The compiled pattern is shared and immutable: find_all() is thread-safe.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace pagoda {

class Regex {
 public:
  // Compiles `pattern` (a literal string when `literal`). Fails with kInvalidArgument carrying
  // PCRE2's message and offset.
  static Result<Regex> compile(std::string_view pattern, bool literal = false);

  // The [begin, end) byte ranges of the successive non-overlapping matches in `text`, appended
  // to `out`. Returns false when PCRE2 gave up (resource limits); `out` then holds the matches
  // found so far.
  bool find_all(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

  const std::string& pattern() const { return pattern_; }

 private:
  struct Code;
  std::shared_ptr<const Code> code_;
  std::string pattern_;
};

// Hugging Face's Split(behavior "Isolated"): `text` cut into the matches of `regex` and the
// stretches between them, in order, as views into `text`; empty stretches are omitted.
// Returns false when matching failed (the rest of the text is then one piece).
bool split_isolated(const Regex& regex, std::string_view text, std::vector<std::string_view>& out);

}  // namespace pagoda
