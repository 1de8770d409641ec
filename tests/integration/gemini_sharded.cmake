# gemini sharded over the data-parallel group (tessera-ddp-tool with PLUGIN gemini): 2 and 4 ranks,
# full and LoRA, equal single with gradient accumulation W; memory() per rank against the buffers
# held, optimizer bytes 1/W of single's; the optimizer shards on disk (offload_optim_frac): losses,
# each rank's disk tier against its files, a checkpoint resumed on single; a killed rank named.
# RUN_SERIAL as integration_ddp.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_gemini_sharded FILE integration/test_gemini_sharded.py
                     LABELS integration dist TIMEOUT 300)
  set_tests_properties(integration_gemini_sharded PROPERTIES RUN_SERIAL TRUE)
endif()
