tessera_add_qt_test(NAME test_config SOURCES unit/test_config.cpp LIBS tessera_hf LABELS unit)
