if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_plan_estimate FILE parity/test_plan_estimate.py LABELS integration TIMEOUT 1200)
endif()
