tessera_add_qt_test(NAME test_memory SOURCES unit/test_memory.cpp LIBS tessera_memory LABELS unit)
