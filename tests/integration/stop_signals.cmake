# SIGINT / SIGTERM outside the training steps (reading and tokenizing the data, the export) end
# the command within two seconds with 128 + the signal, nothing under a final name (issue 15,
# finding 2).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_stop_signals FILE integration/test_stop_signals.py
                     LABELS integration TIMEOUT 300)
endif()
