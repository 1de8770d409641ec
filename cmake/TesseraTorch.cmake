# Finds LibTorch: either an official LibTorch distribution (pass -DCMAKE_PREFIX_PATH=/path/to/libtorch
# or -DTorch_DIR=...), or the one inside the PyPI `torch` wheel of the Python given by
# TESSERA_PYTHON (the bootstrap's venv by default).
if(DEFINED ENV{TESSERA_VENV})
  set(_default_python "$ENV{TESSERA_VENV}/bin/python")
else()
  set(_default_python "$ENV{HOME}/.cache/tessera/venv/bin/python")
endif()
set(TESSERA_PYTHON "${_default_python}" CACHE FILEPATH
    "Python whose torch wheel provides LibTorch (ignored when Torch_DIR is set); also runs the parity tests")

if(NOT Torch_DIR)
  if(EXISTS "${TESSERA_PYTHON}")
    execute_process(
      COMMAND "${TESSERA_PYTHON}" -c "import torch.utils; print(torch.utils.cmake_prefix_path)"
      OUTPUT_VARIABLE _torch_prefix OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
    if(_rc EQUAL 0)
      list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")
    endif()
  endif()
endif()

# The wheel is a CUDA build; its CMake config needs the toolkit even with no GPU present.
set(TESSERA_TORCH_CUDA OFF)
if(EXISTS /usr/local/cuda/bin/nvcc AND NOT CMAKE_CUDA_COMPILER)
  set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
endif()
# No GPU here, so torch's arch auto-detection would fall back to archs nvcc 13 rejects.
if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
  set(ENV{TORCH_CUDA_ARCH_LIST} "7.5;8.0;8.6;9.0")
endif()
# Torch turns TORCH_CUDA_ARCH_LIST into -gencode flags for every CUDA target.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND AND NOT TARGET CUDA::nvToolsExt AND TARGET CUDA::nvtx3)
  # CUDA >= 12.9 ships only nvtx3; older Torch CMake still asks for nvToolsExt.
  add_library(CUDA::nvToolsExt INTERFACE IMPORTED)
  target_link_libraries(CUDA::nvToolsExt INTERFACE CUDA::nvtx3)
endif()

find_package(Torch REQUIRED)
# Torch's CMake copies CMAKE_CXX_STANDARD (20) into CMAKE_CUDA_STANDARD, which CMake 3.25
# cannot map to an nvcc flag; our CUDA targets set their own CUDA_STANDARD.
unset(CMAKE_CUDA_STANDARD)
unset(CMAKE_CUDA_STANDARD_REQUIRED)
if(TORCH_CXX_FLAGS)
  string(APPEND CMAKE_CXX_FLAGS " ${TORCH_CXX_FLAGS}")
endif()
get_filename_component(TESSERA_TORCH_LIB_DIR "${TORCH_LIBRARY}" DIRECTORY)

# Torch's CMake puts /usr/local/cuda/lib on the link path, so ld would resolve
# libtorch_cuda's libnccl.so.2 against the toolkit's older NCCL (undefined ncclCommGrow…).
# Point ld at the wheel's NCCL: the one libtorch_cuda loads at run time through its RPATH.
set(_tessera_wheel_nccl "${TESSERA_TORCH_LIB_DIR}/../../nvidia/nccl/lib")
if(EXISTS "${_tessera_wheel_nccl}")
  add_link_options("LINKER:-rpath-link,${_tessera_wheel_nccl}")
endif()

# Programs link LibTorch's CPU libraries alone; LibTorch's CUDA libraries come with Tessera's CUDA
# module, loaded where an NVIDIA driver is (engine/cuda/runtime.h). Torch's CMake forces
# libtorch.so and libtorch_cuda.so onto every program (--no-as-needed): as needed instead, a
# program keeps only the libraries it calls, and the module, which calls the CUDA ones, keeps them.
foreach(_tessera_forced torch_library torch_cuda_library)
  if(TARGET ${_tessera_forced})
    get_target_property(_tessera_libs ${_tessera_forced} INTERFACE_LINK_LIBRARIES)
    string(REPLACE "-Wl,--no-as-needed," "-Wl,--as-needed," _tessera_libs "${_tessera_libs}")
    set_target_properties(${_tessera_forced} PROPERTIES INTERFACE_LINK_LIBRARIES "${_tessera_libs}")
  endif()
endforeach()
add_link_options(LINKER:--as-needed)

# libstdc++ ahead of LibTorch among each program's libraries: torch 2.11's libtorch.so (the GPU
# machines' version) exports a copy of std::filesystem (64 symbols) that programs linked after it
# bind to, and its remove_all jumps to address 0 (gemini's offload folder crashed at the end of a
# run; tests/gpu/check_build.sh found it). Listed first, libstdc++'s own definitions win.
add_link_options("SHELL:-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state")

if(TESSERA_WITH_CUDA AND CUDAToolkit_FOUND AND CMAKE_CUDA_COMPILER)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    set(TESSERA_TORCH_CUDA ON)
  endif()
endif()
message(STATUS "Tessera: LibTorch ${Torch_VERSION} at ${TESSERA_TORCH_LIB_DIR}, CUDA sources: ${TESSERA_TORCH_CUDA}")
