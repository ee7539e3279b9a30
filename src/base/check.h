// PAGODA_CHECK: aborts with file, line and message when an internal invariant is broken.
// Only for bugs; anything caused by input returns a Status. Kept in release builds.
#pragma once

#include <cstdio>
#include <cstdlib>

#define PAGODA_CHECK(cond)                                                              \
  do {                                                                                  \
    if (!(cond)) {                                                                      \
      std::fprintf(stderr, "%s:%d: PAGODA_CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                     \
    }                                                                                   \
  } while (0)
