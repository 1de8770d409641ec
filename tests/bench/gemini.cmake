# gemini against single on GPT-2 small (step time, disk traffic); label bench, never beside
# another test.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_gemini
           COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_gemini.py)
  set_tests_properties(bench_gemini PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1")
endif()
