# The calibrated time estimate against the same run's measured time (within 30%). RUN_SERIAL: a
# test beside it slows part of the run and not the rest (the fresh-clone CI run of this session:
# 9.1 s planned against 16.9 s measured while a build shared the cores; alone it passes).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_plan_time FILE parity/test_plan_time.py LABELS integration TIMEOUT 900)
  set_tests_properties(integration_plan_time PROPERTIES RUN_SERIAL TRUE)
endif()
