# The runs database survives its writer being killed (issue 15): kill -9 of a writer during its
# inserts, many times, then integrity_check and every committed row (tests/ui/test_runs_db_kill.py).
if(TARGET tessera_ui)
  add_executable(tessera-runs-db-writer tools/runs_db_writer.cpp)
  target_link_libraries(tessera-runs-db-writer PRIVATE tessera_ui)
  tessera_warnings(tessera-runs-db-writer)
  add_test(NAME test_runs_db_kill
           COMMAND ${TESSERA_PYTHON} -m pytest -q -p no:cacheprovider
                   ${CMAKE_CURRENT_SOURCE_DIR}/ui/test_runs_db_kill.py)
  set_tests_properties(test_runs_db_kill PROPERTIES LABELS "ui" TIMEOUT 600
    ENVIRONMENT "TESSERA_RUNS_DB_WRITER=$<TARGET_FILE:tessera-runs-db-writer>;QT_QPA_PLATFORM=offscreen")
endif()
