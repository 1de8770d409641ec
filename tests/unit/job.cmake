tessera_add_qt_test(NAME test_job_spec SOURCES unit/test_job_spec.cpp LIBS tessera_job LABELS unit)
