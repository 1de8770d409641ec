# The GGUF writer's encodings and container reader (engine/export/gguf_*); the export itself is
# checked against gguf-py and llama.cpp in tests/parity/test_gguf_export.py.
if(TESSERA_WITH_TORCH)
  tessera_add_qt_test(NAME test_gguf SOURCES unit/test_gguf.cpp LIBS tessera_export LABELS unit)
endif()
