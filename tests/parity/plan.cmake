# The plan's memory estimate against measured peaks. RUN_SERIAL: beside another test the bf16
# run's measured peak came out lower (estimate ÷ measured 1.26 with ctest -j2, against the 25%
# bound; 1.25 and below alone), so it measures alone.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_plan_estimate FILE parity/test_plan_estimate.py LABELS integration TIMEOUT 1200)
  set_tests_properties(integration_plan_estimate PROPERTIES RUN_SERIAL TRUE)
endif()
