# The zero plugin across real local processes (tessera-ddp-tool with PLUGIN zero): stages 1 and 2
# on 2 and 4 ranks, full and LoRA, equal single with gradient accumulation W; memory() per rank
# against the tensors held; a killed rank named. RUN_SERIAL as integration_ddp.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_zero FILE integration/test_zero.py
                     LABELS integration dist TIMEOUT 180)
  set_tests_properties(integration_zero PROPERTIES RUN_SERIAL TRUE)
endif()
