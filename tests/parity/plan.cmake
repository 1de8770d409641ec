# The plan's memory estimate against measured peaks, in two parts. The tests that measure a run's
# peak RSS or the disk's rate run alone (RUN_SERIAL): beside another test the bf16 run's measured
# peak came out lower (estimate ÷ measured 1.26 with ctest -j2, against the 25% bound; 1.25 and
# below alone). The plans and runs that measure neither (steps per epoch, warnings, refusals, the
# parameter formula: about a minute) go beside other tests.
if(TESSERA_WITH_TORCH)
  set(plan_without_measurements
      "epoch_steps or named_run_that_does_not_fit or auto_changes_the_method or impossible_job or tight_budget or cannot_fit_fails or parameter_formula")
  tessera_add_pytest(NAME integration_plan_estimate FILE parity/test_plan_estimate.py LABELS integration
                     TIMEOUT 1200 PYTEST_ARGS -k "not (${plan_without_measurements})")
  set_tests_properties(integration_plan_estimate PROPERTIES RUN_SERIAL TRUE)
  tessera_add_pytest(NAME integration_plan_decisions FILE parity/test_plan_estimate.py LABELS integration
                     TIMEOUT 900 PYTEST_ARGS -k "${plan_without_measurements}")
endif()
