tessera_add_qt_test(NAME test_plan SOURCES unit/test_plan.cpp LIBS tessera_plan LABELS unit)
