# The CUDA runtime module (engine/cuda/runtime.h): a CPU process maps none of LibTorch's CUDA
# libraries (the dynamic loader's own account), starts lighter for it (peak RSS), and where the
# module is loaded it is in before LibTorch first asks about CUDA.
if(TESSERA_WITH_TORCH AND TESSERA_TORCH_CUDA)
  tessera_add_pytest(NAME integration_cuda_module FILE integration/test_cuda_module.py
                     LABELS integration TIMEOUT 300)
endif()
