# The README's main job: `tessera-cli demo` at its defaults reaches the held-out accuracy README.md
# states (under a minute on an idle 2-core machine). RUN_SERIAL: its two OpenMP threads sharing
# the cores with another test ran several times slower.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_demo FILE integration/test_demo.py LABELS integration TIMEOUT 1200)
  set_tests_properties(integration_demo PROPERTIES RUN_SERIAL TRUE)
endif()
