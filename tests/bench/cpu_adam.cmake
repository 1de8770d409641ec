# Fused CPU AdamW throughput: ours (tessera-cpu-adam-tool bench, declared in
# parity/cpu_adam.cmake) ÷ DeepSpeedCPUAdam, torch.optim.AdamW fused and foreach, and ÷ a
# STREAM-triad memory bound, at 1 and 2 threads; label bench. It only prints; it fails only on a
# crash. RUN_SERIAL: a throughput figure taken beside another test is wrong.
if(TESSERA_WITH_TORCH)
  add_test(NAME bench_cpu_adam
           COMMAND ${TESSERA_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/bench/bench_cpu_adam.py)
  set_tests_properties(bench_cpu_adam PROPERTIES LABELS bench TIMEOUT 3600 RUN_SERIAL TRUE
    ENVIRONMENT "TESSERA_TOOLS_DIR=${CMAKE_CURRENT_BINARY_DIR};DS_ACCELERATOR=cpu")
endif()
