# A config.json asking for more than the machine has (num_hidden_layers 1e9, vocab_size 1e12, a
# parameter count beyond 64 bits), or whose heads do not split hidden_size, refused with exit 2
# by run, eval, generate and export before anything is built (test_config_refusals.py).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_config_refusals FILE parity/test_config_refusals.py
                     LABELS parity TIMEOUT 900)
endif()
