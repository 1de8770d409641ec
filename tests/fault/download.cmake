# A Hub download killed with SIGKILL at random moments, then resumed, against the local Hub server
# (issue 15); label fault.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME fault_download_kills FILE fault/test_download_kills.py LABELS fault TIMEOUT 900)
endif()
