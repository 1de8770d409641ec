# The hub client against a local Hub-speaking server with fault injection (tests/pylib/hub_server.py);
# needs no torch in tessera-cli, only the venv's transformers / huggingface_hub as oracles.
tessera_add_pytest(NAME integration_hub FILE integration/test_hub.py LABELS integration TIMEOUT 600)
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME integration_hub_job FILE integration/test_hub_job.py LABELS integration TIMEOUT 900)
endif()
