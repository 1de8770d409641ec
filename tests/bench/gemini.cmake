# gemini against single on GPT-2 small (step time, disk traffic); label bench, never beside
# another test.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_gemini
           COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_gemini.py)
  set_tests_properties(bench_gemini PROPERTIES LABELS bench TIMEOUT 1800 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1")
endif()

# Training beyond memory: a generated ~843M-parameter llama inside a 4 GiB memory cgroup (issue 9,
# benchmark 2); needs root for the cgroup, ~20 GiB of disk and ~16 GiB of RAM.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_gemini_beyond_ram
           COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_gemini_beyond_ram.py)
  set_tests_properties(bench_gemini_beyond_ram PROPERTIES LABELS bench TIMEOUT 5400 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};HF_HUB_OFFLINE=1")
endif()
