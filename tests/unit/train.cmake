# Trainer (engine/optim, engine/train): unit tests and the test-only probe used by the parity
# suite (tests/parity/train.cmake).
if(TESSERA_WITH_TORCH)
  # Plugins come from the registry: the tests register them (plugins/builtin_plugins.h).
  tessera_add_qt_test(NAME test_train SOURCES unit/test_train.cpp
                      LIBS tessera_train tessera_plugins tessera_job LABELS unit)

  # Test-only: N training steps of our trainer on a model folder and fixed token batches.
  add_executable(tessera-train-probe tools/train_probe.cpp)
  target_link_libraries(tessera-train-probe PRIVATE tessera_runner)
  tessera_warnings(tessera-train-probe)
  set_target_properties(tessera-train-probe PROPERTIES BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")

  # Same NCCL link path fix as tests/unit/model.cmake (the wheel's NCCL, not the toolkit's).
  set(_tessera_train_nccl "${TESSERA_TORCH_LIB_DIR}/../../nvidia/nccl/lib")
  if(EXISTS "${_tessera_train_nccl}")
    foreach(_target test_train tessera-train-probe)
      target_link_options(${_target} PRIVATE "LINKER:-rpath-link,${_tessera_train_nccl}")
    endforeach()
  endif()
endif()
