# KV cache, generation, evaluation, export and the merged-LoRA check (engine/model, engine/export).
if(TESSERA_WITH_TORCH)
  tessera_add_qt_test(NAME test_generate SOURCES unit/test_generate.cpp LIBS tessera_export
                      LABELS unit)
endif()
