# QLoRA under ddp, zero and gemini (issue 27): one job as 2 processes with a quantized base against
# one process with accumulation 2 (losses and merged export), gemini with chunks on disk against
# single, auto over 2 processes, and hybrid (no quantized base) refused by name. RUN_SERIAL as integration_launch.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_qlora_dist FILE integration/test_qlora_dist.py
                     LABELS integration dist TIMEOUT 300)
  set_tests_properties(integration_qlora_dist PROPERTIES RUN_SERIAL TRUE)
endif()
