# A run reads its input model's config.json and safetensors files once (strace counts the opens).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_run_reads FILE parity/test_run_reads.py LABELS integration TIMEOUT 900)
endif()
