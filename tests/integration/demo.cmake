# The README's main job: `tessera-cli demo` at its defaults reaches the held-out accuracy README.md
# states (under a minute on an idle 2-core machine). It ran alone (RUN_SERIAL) while its two
# OpenMP threads spun on the cores of the test beside it, several times slower; with the tests'
# OMP_WAIT_POLICY=PASSIVE (tests/CMakeLists.txt) it shares them.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_demo FILE integration/test_demo.py LABELS integration TIMEOUT 1200)
endif()
