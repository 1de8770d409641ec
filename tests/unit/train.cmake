# Trainer (engine/optim, engine/train): unit tests and the test-only probe used by the parity
# suite (tests/parity/train.cmake).
if(TESSERA_WITH_TORCH)
  # Plugins come from the registry: the tests register them (plugins/builtin_plugins.h).
  tessera_add_qt_test(NAME test_train SOURCES unit/test_train.cpp
                      LIBS tessera_train tessera_plugins tessera_job LABELS unit)

  # tessera-train-probe, the parity suite's engine side, is in tests/tools/probes.cmake.
  set(_tessera_train_nccl "${TESSERA_TORCH_LIB_DIR}/../../nvidia/nccl/lib")
  if(EXISTS "${_tessera_train_nccl}")
    target_link_options(test_train PRIVATE "LINKER:-rpath-link,${_tessera_train_nccl}")
  endif()
endif()
