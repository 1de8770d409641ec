# Every parser fuzzed (issue 15): tests/fuzz/run.sh builds the libFuzzer targets with clang, ASan
# and UBSan in the build's fuzz/ folder (a CMake project of its own, tests/fuzz/CMakeLists.txt)
# and fuzzes each for 6 s (the suite's share; its corpus grows across runs), after replaying
# every input that ever failed. `tests/fuzz/run.sh --minutes N` is the long form. Needs clang with libFuzzer; without it the test is left out.
find_program(TESSERA_FUZZ_CLANGXX NAMES clang++ clang++-14)
if(TESSERA_FUZZ_CLANGXX)
  add_test(NAME fuzz_parsers
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/fuzz/run.sh --seconds-per-target 6)
  # PROCESSORS 2: the clang build uses both cores; the fuzzers then run one at a time.
  set_tests_properties(fuzz_parsers PROPERTIES LABELS fuzz TIMEOUT 1800 PROCESSORS 2
    ENVIRONMENT "TESSERA_FUZZ_BUILD_DIR=${CMAKE_BINARY_DIR}/fuzz;TESSERA_FUZZ_BUILD_JOBS=2;TESSERA_FUZZ_CXX=${TESSERA_FUZZ_CLANGXX}")
else()
  message(STATUS "Tessera: no clang++, the fuzz_parsers test is left out")
endif()
