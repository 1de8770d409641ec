# Generation, eval and export against transformers (tests/parity/test_generate_parity.py).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_generate FILE parity/test_generate_parity.py LABELS parity
                     TIMEOUT 1200)
  # Uses tessera-model-probe (tests/tools/probes.cmake) for our logits.
  set_property(TEST parity_generate APPEND PROPERTY DEPENDS tessera-model-probe)
  # Generated text as tokenizer.decode gives it: multi-byte characters over several byte tokens
  # (byte-level and byte-fallback), streamed pieces, stop reasons (test_generate_decode.py).
  tessera_add_pytest(NAME parity_generate_decode FILE parity/test_generate_decode.py
                     LABELS parity TIMEOUT 900)
endif()
