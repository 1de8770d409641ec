# engine/parallel across real local processes (tessera-tp-tool, one process per rank): the
# tensor-parallel layers on 2 and 4 ranks (the world, and the tensor groups of a 2 × 2 mesh)
# against the same model computed whole. RUN_SERIAL: four ranks on two cores.
if(TESSERA_WITH_TORCH)
  add_executable(tessera-tp-tool tools/tp_tool.cpp)
  target_link_libraries(tessera-tp-tool PRIVATE tessera_parallel)
  tessera_warnings(tessera-tp-tool)
  set_target_properties(tessera-tp-tool PROPERTIES BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")

  tessera_add_pytest(NAME integration_tensor_parallel FILE integration/test_tensor_parallel.py
                     LABELS integration dist TIMEOUT 120)
  set_tests_properties(integration_tensor_parallel PROPERTIES RUN_SERIAL TRUE)
endif()
