if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_finetune FILE parity/test_finetune_cli.py LABELS integration TIMEOUT 1200)
endif()
