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

# The host floor of the disk tier: a generated 297M llama all on disk under host_budget 1.5 GiB,
# in a memory cgroup where one can be made (issue 25); BENCH_FLOOR_MODEL=large for a 1.3B one.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_host_floor
           COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_host_floor.py)
  set_tests_properties(bench_host_floor PROPERTIES LABELS bench TIMEOUT 3600 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_CLI=$<TARGET_FILE:tessera-cli>;HF_HUB_OFFLINE=1")
endif()
