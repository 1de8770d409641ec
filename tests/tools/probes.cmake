# The test probes that need no Qt: included by tests/CMakeLists.txt with the tests, and by
# tests/tools/CMakeLists.txt alone (TESSERA_BUILD_PROBES) for tests/gpu/run.sh's build on a GPU
# machine without Qt. Both put them in the folder TESSERA_TOOLS_DIR names for the pytest suites.
if(TESSERA_WITH_TORCH)
  # One forward pass of a model folder, for tests/parity/test_model_parity.py and tests/gpu.
  add_executable(tessera-model-probe ${CMAKE_CURRENT_LIST_DIR}/model_probe.cpp)
  target_link_libraries(tessera-model-probe PRIVATE tessera_model)
  tessera_warnings(tessera-model-probe)

  # N training steps of our trainer on a model folder and fixed token batches
  # (tests/parity/test_train_parity.py and tests/gpu).
  add_executable(tessera-train-probe ${CMAKE_CURRENT_LIST_DIR}/train_probe.cpp)
  target_link_libraries(tessera-train-probe PRIVATE tessera_runner)
  tessera_warnings(tessera-train-probe)

  # The wheel's NCCL, not the toolkit's, on the link path (as cmake/TesseraTorch.cmake says).
  set(_tessera_probes_nccl "${TESSERA_TORCH_LIB_DIR}/../../nvidia/nccl/lib")
  foreach(_target tessera-model-probe tessera-train-probe)
    set_target_properties(${_target} PROPERTIES BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")
    if(EXISTS "${_tessera_probes_nccl}")
      target_link_options(${_target} PRIVATE "LINKER:-rpath-link,${_tessera_probes_nccl}")
    endif()
  endforeach()
endif()
