# Hub downloads from a local server: our client's throughput against huggingface_hub's, and what a
# resume re-sends (issue 10); label bench, never beside another test.
if(TARGET tessera-cli)
  add_test(NAME bench_hub COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_hub.py)
  set_tests_properties(bench_hub PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_CLI=$<TARGET_FILE:tessera-cli>")
endif()
