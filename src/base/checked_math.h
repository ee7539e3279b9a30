// Overflow-checked integer arithmetic for sizes read from untrusted files.
// Each returns false (and leaves *out unspecified) when the exact result does not fit.
#pragma once

#include <cstdint>

namespace pagoda {

inline bool checked_add(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
inline bool checked_mul(uint64_t a, uint64_t b, uint64_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
// Rounds `value` up to a multiple of `alignment` (> 0).
inline bool checked_align_up(uint64_t value, uint64_t alignment, uint64_t* out) {
  uint64_t bumped;
  if (!checked_add(value, alignment - 1, &bumped)) return false;
  *out = bumped / alignment * alignment;
  return true;
}

}  // namespace pagoda
