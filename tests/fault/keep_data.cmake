# Bad input never costs the user's data (issue 15): refusals against a run folder leave its
# checkpoints, export and files as they were; label fault.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME fault_bad_input_keeps_data FILE fault/test_bad_input_keeps_data.py LABELS fault
                     TIMEOUT 300)
endif()
