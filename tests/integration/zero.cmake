# The zero plugin across real local processes (tessera-ddp-tool with PLUGIN zero): stages 1 and 2
# on 2 and 4 ranks, full and LoRA, equal single with gradient accumulation W; memory() per rank
# against the tensors held; a killed rank named. RUN_SERIAL as integration_ddp.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_zero FILE integration/test_zero.py
                     LABELS integration dist TIMEOUT 180)
  set_tests_properties(integration_zero PROPERTIES RUN_SERIAL TRUE)
endif()

# Whole jobs with zero through tessera-cli launch: one job continued across layouts (zero stage 2
# on 2 ranks -> single -> zero stage 1 on 4 ranks) with the losses of an uninterrupted run, the
# layout-free checkpoint index, the same export from any layout, an older checkpoint resumed.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_zero_checkpoint FILE integration/test_zero_checkpoint.py
                     LABELS integration dist TIMEOUT 180)
  set_tests_properties(integration_zero_checkpoint PROPERTIES RUN_SERIAL TRUE)
endif()
