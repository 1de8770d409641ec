# Strategy hybrid (tensor × data parallelism) in whole jobs through tessera-cli launch: tp 2 on
# llama, qwen2 and mistral and tp 2 × dp 2 on llama equal to one process (losses and export),
# each rank's weights its blocks, checkpoints resumed across layouts, refusals named.
# RUN_SERIAL: up to four ranks at a time on two cores.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_hybrid FILE integration/test_hybrid.py
                     LABELS integration dist TIMEOUT 900)
  set_tests_properties(integration_hybrid PROPERTIES RUN_SERIAL TRUE)
endif()
