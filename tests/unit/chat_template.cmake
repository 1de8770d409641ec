tessera_add_qt_test(NAME test_chat_template SOURCES unit/test_chat_template.cpp LIBS tessera_hf
                    LABELS unit)
