# kill -9 anywhere (issue 15): a fine-tune killed at random moments under single, gemini with the
# optimizer state on disk and a 2-rank ddp job, resumed and compared with an uninterrupted run.
# Short form here (TESSERA_FAULT_KILLS=3 per configuration); tests/fault/run.sh --kills N is the
# long form. RUN_SERIAL: the kill moments are drawn from the uninterrupted run's duration.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME fault_kill_anywhere FILE fault/test_kill_anywhere.py
                     LABELS fault TIMEOUT 900)
  set_tests_properties(fault_kill_anywhere PROPERTIES RUN_SERIAL TRUE)
endif()
