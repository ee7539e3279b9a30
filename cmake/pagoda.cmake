# pagoda_add_library(NAME SOURCES ... DEPS ...): one static library per source folder.
# Includes are rooted at src/ (and the repository root for apps/), so code writes
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
# A test's own files compile at a low level: they call into the libraries (which keep the
# build's level) and check what comes back. In the sanitizer builds -O0 halves their compile time
# under ASan + UBSan (openai_protocol_test.cpp: 38 s against 84 s on the 2-core Zen 3 CI machine;
# the test files were a third of the ASan build). In Release, -O1 (747 of the Release build's
# 2,128 CPU-seconds were test files; openai_protocol_test.cpp took 88 s at -O3, 37 s at -O1 and
# 21 s at -O0 under load). Not -O0 there: the templates a test instantiates (nlohmann::json's
# parser) are one definition for the whole binary, and the linker may keep the test's copy, so
# at -O0 the library's own JSON parsing ran unoptimized and the OpenAI protocol tests took 7 s
# each instead of 0.8. OPTIMIZED keeps the build's level for tests whose own code computes
# (float64 reference models and kernels).
function(pagoda_add_test name)
  if(NOT PAGODA_BUILD_TESTS)
    return()
  endif()
  cmake_parse_arguments(ARG "OPTIMIZED" "" "SOURCES;DEPS;LABELS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_link_libraries(${name} PRIVATE ${ARG_DEPS} pagoda_test_support GTest::gtest GTest::gtest_main)
  if(PAGODA_SANITIZE AND NOT ARG_OPTIMIZED)
    target_compile_options(${name} PRIVATE -O0)
  elseif(NOT ARG_OPTIMIZED)
    target_compile_options(${name} PRIVATE -O1)
  endif()
  # One label per binary (a list would be split apart by gtest_discover_tests).
  set(label ${name})
  if(ARG_LABELS)
    set(label ${ARG_LABELS})
  endif()
  gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST DISCOVERY_TIMEOUT 60 PROPERTIES LABELS ${label})
endfunction()
