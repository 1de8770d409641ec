# GGUF export read back with the `gguf` package and, where llama-cpp-python is importable, run by
# llama.cpp against transformers (tests/parity/test_gguf_export.py).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_gguf FILE parity/test_gguf_export.py LABELS parity TIMEOUT 900)
endif()
