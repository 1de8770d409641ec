# The gemini plugin against single through tessera-cli run (losses, checkpoints across plugins,
# refused options, a full offload disk).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_gemini FILE parity/test_gemini.py LABELS parity TIMEOUT 1200)
endif()
