// Where tests find the real model files of ../shared/models.
//
// PAGODA_TEST_DATA overrides the folder. Where it is missing, tests that need it skip with a
// message saying so, except when CI or PAGODA_REQUIRE_TEST_DATA is set: then they fail.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace pagoda::testing {

// The test data folder (no trailing slash); it may not exist.
std::string test_data_dir();
// The full path of `relative` inside it, or "" when that file is missing.
std::string find_test_file(const std::string& relative);
// True when missing test data must fail the test rather than skip it.
bool test_data_required();
// A fresh empty temporary directory for this test, removed with what it holds when the test
// binary exits normally (a test may remove it sooner).
std::string make_temp_dir();

}  // namespace pagoda::testing

// Declares `var` as the path of the test data file `relative`, or skips (fails in CI) the test.
#define PAGODA_TEST_FILE(var, relative)                                                     \
  std::string var = ::pagoda::testing::find_test_file(relative);                            \
  if (var.empty()) {                                                                        \
    if (::pagoda::testing::test_data_required()) {                                          \
      FAIL() << "test data missing: " << ::pagoda::testing::test_data_dir() << "/" << (relative); \
    }                                                                                       \
    GTEST_SKIP() << "test data missing: " << ::pagoda::testing::test_data_dir() << "/"      \
                 << (relative) << " (set PAGODA_TEST_DATA to the shared/models folder)";    \
  }
