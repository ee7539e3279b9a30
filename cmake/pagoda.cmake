# pagoda_add_library(NAME SOURCES ... DEPS ...): one static library per source folder.
# Includes are rooted at src/ (and the repository root for backends/), so code writes
# #include "base/status.h".
function(pagoda_add_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR})
  target_link_libraries(${name} PUBLIC ${ARG_DEPS})
endfunction()

# pagoda_add_test(NAME SOURCES ... DEPS ... [LABELS ...] [OPTIMIZED]): a GoogleTest binary whose
# tests ctest lists one by one. The label "untrusted-input" marks tests that `make test` also runs
# under ASan.
# In the sanitizer builds a test's own files compile at -O0: they call into the libraries (which
# stay at the build's -O1) and check what comes back, and -O0 halves their compile time under ASan
# + UBSan (openai_protocol_test.cpp: 38 s against 84 s on the 2-core Zen 3 CI machine; the test
# files were a third of the ASan build). OPTIMIZED keeps the build's level for tests whose own
# code computes (float64 reference models and kernels).
function(pagoda_add_test name)
  if(NOT PAGODA_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "OPTIMIZED" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} pagoda_test_support GTest::gtest GTest::gtest_main)
  if(PAGODA_SANITIZE AND NOT ARG_OPTIMIZED)
    target_compile_options(${name} PRIVATE -O0)
  endif()
  # One label per binary (a list would be split apart by gtest_discover_tests).
  set(label ${name})
  if(ARG_LABELS)
    set(label ${ARG_LABELS})
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60 PROPERTIES LABELS ${label})
endfunction()
