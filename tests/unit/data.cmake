tessera_add_qt_test(NAME test_data SOURCES unit/test_data.cpp LIBS tessera_data LABELS unit)
