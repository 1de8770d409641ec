# Every parser fuzzed (issue 15): tests/fuzz/run.sh builds the libFuzzer targets with clang, ASan
# and UBSan in the build's fuzz/ folder (a CMake project of its own, tests/fuzz/CMakeLists.txt)
# and fuzzes each for 4 s (the suite's share; its corpus grows across runs), after replaying
# every input that ever failed. `tests/fuzz/run.sh --minutes N` is the long form. Needs clang with
# libFuzzer; without it the tests are left out.
find_program(TESSERA_FUZZ_CLANGXX NAMES clang++ clang++-14)
if(TESSERA_FUZZ_CLANGXX)
  set(fuzz_environment "TESSERA_FUZZ_BUILD_DIR=${CMAKE_BINARY_DIR}/fuzz;TESSERA_FUZZ_BUILD_JOBS=2;TESSERA_FUZZ_CXX=${TESSERA_FUZZ_CLANGXX}")
  # Two tests: the clang build uses both cores (PROCESSORS 2), the fuzzers one (each runs alone),
  # so the fuzzing goes on beside another test instead of holding both slots.
  add_test(NAME fuzz_build COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run.sh --build-only)
  set_tests_properties(fuzz_build PROPERTIES LABELS fuzz TIMEOUT 1800 PROCESSORS 2
    FIXTURES_SETUP fuzz_targets ENVIRONMENT "${fuzz_environment}")
  add_test(NAME fuzz_parsers
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run.sh --no-build --seconds-per-target 4)
  set_tests_properties(fuzz_parsers PROPERTIES LABELS fuzz TIMEOUT 900
    FIXTURES_REQUIRED fuzz_targets ENVIRONMENT "${fuzz_environment}")
else()
  message(STATUS "Tessera: no clang++, the fuzz tests are left out")
endif()
