tessera_add_qt_test(NAME test_tokenizer SOURCES unit/test_tokenizer.cpp LIBS tessera_hf
                    LABELS unit)
