# The ddp plugin across real local processes (tessera-ddp-tool, one process per rank): weights
# after N steps on 1, 2 and 4 ranks equal the single plugin's with gradient accumulation over the
# same micro-batches (full and LoRA), buckets all-reduced before backward ends, and a rank killed
# mid-training named by the others. RUN_SERIAL for the same reason as integration_dist.
if(TESSERA_WITH_TORCH)
  add_executable(tessera-ddp-tool tools/ddp_tool.cpp)
  target_link_libraries(tessera-ddp-tool PRIVATE tessera_plugins tessera_dist)
  tessera_warnings(tessera-ddp-tool)
  set_target_properties(tessera-ddp-tool PROPERTIES BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")

  tessera_add_pytest(NAME integration_ddp FILE integration/test_ddp.py
                     LABELS integration dist TIMEOUT 180)
  set_tests_properties(integration_ddp PROPERTIES RUN_SERIAL TRUE)
endif()
