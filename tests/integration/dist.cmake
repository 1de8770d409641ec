# engine/dist across real local processes: every collective with exact results on 2 and 4 ranks
# (world and sub-groups), a rank killed (SIGKILL) or stopped (SIGSTOP) mid-collective named by the
# others within the timeout, and the environment's errors. RUN_SERIAL: four ranks plus a build on
# two cores would stretch the timeouts the test measures.
if(TESSERA_WITH_TORCH)
  add_executable(tessera-dist-tool tools/dist_tool.cpp)
  target_link_libraries(tessera-dist-tool PRIVATE tessera_dist)
  tessera_warnings(tessera-dist-tool)
  set_target_properties(tessera-dist-tool PROPERTIES BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")

  tessera_add_pytest(NAME integration_dist FILE integration/test_dist.py
                     LABELS integration dist TIMEOUT 180)
  set_tests_properties(integration_dist PROPERTIES RUN_SERIAL TRUE)
endif()
