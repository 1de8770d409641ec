# Checkpoint manifests' XXH3-128 against the xxhash package, legacy manifests resumed, a changed
# file skipped (issue 15, finding 7).
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_checkpoint_checksum FILE parity/test_checkpoint_checksum.py
                     LABELS parity)
  # The checksum tool of bench/bench_checksum.py: torch-free, the engine's core alone.
  add_executable(tessera-checksum-tool tools/checksum_tool.cpp)
  target_link_libraries(tessera-checksum-tool PRIVATE tessera_core)
  tessera_warnings(tessera-checksum-tool)
endif()
