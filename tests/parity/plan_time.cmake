if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_plan_time FILE parity/test_plan_time.py LABELS integration TIMEOUT 900)
endif()
