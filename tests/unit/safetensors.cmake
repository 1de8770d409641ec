tessera_add_qt_test(NAME test_safetensors SOURCES unit/test_safetensors.cpp LIBS tessera_hf
                    LABELS unit)
