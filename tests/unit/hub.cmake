tessera_add_qt_test(NAME test_hub SOURCES unit/test_hub.cpp LIBS tessera_hub LABELS unit)
