# The trainer against transformers + torch.optim.AdamW and peft (the issue's acceptance tests).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_train FILE parity/test_train_parity.py LABELS parity TIMEOUT 1200)
  set_property(TEST parity_train APPEND PROPERTY DEPENDS tessera-train-probe)
endif()
