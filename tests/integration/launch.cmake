# tessera-cli launch: one job as 2 local processes (strategy ddp) against one process with
# gradient accumulation 2, checkpoint and resume across ranks, kill -9 of a rank, and a strategy
# that does not distribute refused before starting. RUN_SERIAL: two ranks plus a build on two
# cores would stretch the timings the kill case measures.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_launch FILE integration/test_launch.py
                     LABELS integration dist TIMEOUT 180)
  set_tests_properties(integration_launch PROPERTIES RUN_SERIAL TRUE)
endif()
