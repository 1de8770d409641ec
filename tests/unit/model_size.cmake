tessera_add_qt_test(NAME test_model_size SOURCES unit/test_model_size.cpp LIBS tessera_plan
                    LABELS unit)
