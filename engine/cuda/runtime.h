#pragma once
// The CUDA runtime module: everything of ours that calls CUDA, LibTorch's CUDA libraries or NCCL
// (the device tier, the caching allocator's figures, NCCL's process groups, our kernels) lives
// in a shared library of its own, libtessera_cuda.so, loaded when the program starts, and only
// where an NVIDIA driver is installed. Programs link LibTorch's CPU libraries alone: on a machine
// without a GPU they no longer map libtorch_cuda, cuBLAS, cuDNN and NCCL (a quarter of a GiB of
// resident memory and about half a second at every start), and a package without the CUDA
// libraries runs.
//
// LibTorch decides once per process whether CUDA exists (its CUDA hooks are created on the first
// question about CUDA and kept), so the module must be loaded before anything asks: a static
// initializer in loader.cpp does it, before main().
//
//   TESSERA_CUDA=0       never load it (the GPU stays unused)
//   TESSERA_CUDA=1       load it even without a driver (tests: LibTorch then sees 0 GPUs)
//   TESSERA_CUDA_MODULE  the module's path, instead of searching beside the program, in
//                        ../lib/tessera and in the build tree
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "cuda/kernels.h"

namespace c10d {
class Backend;
class Store;
}  // namespace c10d

namespace tessera::train {
class DeviceTier;
struct DeviceMemory;
}  // namespace tessera::train

namespace tessera::cuda {

// Bumped whenever Runtime changes: a module from another build is refused, not called.
inline constexpr int kRuntimeAbi = 3;

// What the module does; every pointer is set.
struct Runtime {
  int abi = kRuntimeAbi;
  // train/device_tier.h's make_cuda_device_tier.
  std::unique_ptr<train::DeviceTier> (*make_device_tier)(int index, std::uint64_t budget);
  // The caching allocator's and the driver's figures for GPU `index`; false if unreadable.
  bool (*device_memory)(int index, train::DeviceMemory& out);
  // Makes GPU `index` the current device of this thread (collectives and allocations that name
  // no device use it).
  void (*set_device)(int index);
  // Whether LibTorch was built with NCCL; make_nccl_backend throws tessera::Error if not.
  bool has_nccl;
  c10::intrusive_ptr<c10d::Backend> (*make_nccl_backend)(const c10::intrusive_ptr<c10d::Store>&,
                                                         int rank, int size,
                                                         std::chrono::milliseconds timeout);
  // kernels.h's rms_norm_forward_f32 on GPU `device` (made current for the launch), on torch's
  // current stream there.
  int (*rms_norm_forward_f32)(const float* x, const float* weight, float* y, std::int64_t rows,
                              std::int64_t cols, float eps, int device);
  // kernels.h's dequantize_four_bit / dequantize_int8 on GPU `device`, on torch's current
  // stream there (QLoRA's base, a tile at a time).
  int (*dequantize_four_bit)(const FourBitBlock& block, DequantizedType type, void* out,
                             int device);
  int (*dequantize_int8)(const Int8Block& block, DequantizedType type, void* out, int device);
};

// The loaded module, or null (no driver, no module, TESSERA_CUDA=0, or it failed to load).
const Runtime* runtime();

// One line for `tessera-cli version` and for errors that need a GPU: "loaded from PATH", or why
// it is not ("no NVIDIA driver (libcuda.so.1) on this machine", "not installed: …", the loader's
// error).
std::string runtime_status();

// Where the module was loaded from; empty when it was not.
std::string runtime_path();

// For a message that no GPU is usable: "" when the module is loaded (LibTorch found none), else
// " (Tessera's CUDA module is not loaded: …)", so the user learns which it was.
std::string runtime_note();

}  // namespace tessera::cuda
