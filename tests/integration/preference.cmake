# Preference tuning through tessera-cli (issue 27): DPO with LoRA learning and exporting, full DPO
# on 2 processes (ddp, zero, sharded gemini) and under gemini with chunks on disk against one
# process with accumulation 2, LoRA DPO under gemini against single, exact resume, refusals.
# RUN_SERIAL as integration_launch.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_preference FILE integration/test_preference_cli.py
                     LABELS integration dist TIMEOUT 600)
  set_tests_properties(integration_preference PROPERTIES RUN_SERIAL TRUE)
endif()
