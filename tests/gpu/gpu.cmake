# The GPU check's suite (tests/gpu/test_gpu.py) on the CPU, so that it keeps working between the
# sessions that are lent a GPU: the same comparisons with TESSERA_GPU_CHECK_DEVICE=cpu (the checks
# that need a GPU skip, saying so). tests/gpu/run.sh runs it on CUDA.
if(TESSERA_WITH_TORCH)
  tessera_add_pytest(NAME parity_gpu_suite_on_cpu FILE gpu/test_gpu.py LABELS parity TIMEOUT 900)
  set_property(TEST parity_gpu_suite_on_cpu APPEND PROPERTY ENVIRONMENT
               "TESSERA_GPU_CHECK_DEVICE=cpu")
  set_property(TEST parity_gpu_suite_on_cpu APPEND PROPERTY DEPENDS tessera-model-probe
                                                                   tessera-train-probe)
endif()
