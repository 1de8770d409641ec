# The checkpoint checksum's GB/s against cp of the same file and the FNV loop it replaced
# (tessera-checksum-tool, declared in parity/checksum.cmake); label bench, never beside another
# test.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_checksum
           COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_checksum.py)
  set_tests_properties(bench_checksum PROPERTIES LABELS bench TIMEOUT 1200 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR}")
endif()
