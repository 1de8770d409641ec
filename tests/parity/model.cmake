# transformers is the oracle for every model family's logits, hidden states and loss.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_model FILE parity/test_model_parity.py LABELS parity TIMEOUT 1200)
  set_property(TEST parity_model APPEND PROPERTY DEPENDS tessera-model-probe)
endif()
