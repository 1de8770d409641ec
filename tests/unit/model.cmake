# Model families (engine/model): unit tests and the transformers parity suite.
if(TESSERA_WITH_TORCH)
  tessera_add_qt_test(NAME test_model SOURCES unit/test_model.cpp LIBS tessera_model LABELS unit)

  # Test-only: one forward pass of a model folder, for tests/parity/test_model_parity.py.
  add_executable(tessera-model-probe tools/model_probe.cpp)
  target_link_libraries(tessera-model-probe PRIVATE tessera_model)
  tessera_warnings(tessera-model-probe)
  set_target_properties(tessera-model-probe PROPERTIES BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")

endif()
