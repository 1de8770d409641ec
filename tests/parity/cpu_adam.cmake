# The fused CPU AdamW (engine/optim/cpu_adam.h) against torch.optim.AdamW: every ISA level this
# machine runs, odd sizes (vector tails), 1 and 2 threads, bf16/fp16 copies, NaN/inf gradients.
if(TESSERA_WITH_TORCH)
  # Test-only front end: `run` (N steps from a safetensors file), `isa`, `bench` (used by
  # bench/bench_cpu_adam.py).
  add_executable(tessera-cpu-adam-tool tools/cpu_adam_tool.cpp)
  target_link_libraries(tessera-cpu-adam-tool PRIVATE tessera_optim tessera_hf)
  tessera_warnings(tessera-cpu-adam-tool)
  set_target_properties(tessera-cpu-adam-tool PROPERTIES BUILD_RPATH "${TESSERA_TORCH_LIB_DIR}")
  # Same NCCL link path fix as tests/unit/model.cmake (the wheel's NCCL, not the toolkit's).
  set(_tessera_cpu_adam_nccl "${TESSERA_TORCH_LIB_DIR}/../../nvidia/nccl/lib")
  if(EXISTS "${_tessera_cpu_adam_nccl}")
    target_link_options(tessera-cpu-adam-tool PRIVATE "LINKER:-rpath-link,${_tessera_cpu_adam_nccl}")
  endif()

  tessera_add_pytest(NAME parity_cpu_adam FILE parity/test_cpu_adam.py LABELS parity TIMEOUT 1200)
  set_property(TEST parity_cpu_adam APPEND PROPERTY DEPENDS tessera-cpu-adam-tool)
endif()
