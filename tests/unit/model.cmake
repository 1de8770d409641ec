# Model families (engine/model): unit tests and the transformers parity suite.
if(TESSERA_WITH_TORCH)
  tessera_add_qt_test(NAME test_model SOURCES unit/test_model.cpp LIBS tessera_model LABELS unit)
  # tessera-model-probe, the parity suite's engine side, is in tests/tools/probes.cmake.
endif()
