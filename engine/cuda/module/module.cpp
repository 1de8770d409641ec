// The CUDA runtime module's entry point (cuda/runtime.h) and its smaller functions.
#include "cuda/module/module.h"

#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>

#include "cuda/kernels.h"
#include "train/device_memory.h"

namespace tessera::cuda {
namespace {

bool device_memory(int index, train::DeviceMemory& m) {
  const auto device = static_cast<c10::DeviceIndex>(index);
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  // Index 0 of each StatArray is StatType::AGGREGATE (every pool), in every LibTorch version.
  m.allocated = static_cast<std::uint64_t>(stats.allocated_bytes[0].current);
  m.reserved = static_cast<std::uint64_t>(stats.reserved_bytes[0].current);
  m.peak_allocated = static_cast<std::uint64_t>(stats.allocated_bytes[0].peak);
  c10::cuda::CUDAGuard guard(device);
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    m.free = free;
    m.total = total;
  }
  return true;
}

void set_device(int index) {
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(index));
}

// The kernel on the tensors' GPU (not whichever the thread has current: `--device cuda:1`) and
// on torch's current stream there, so that it is ordered after the ops that made its input.
int rms_norm_forward_on(const float* x, const float* weight, float* y, std::int64_t rows,
                        std::int64_t cols, float eps, int device) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  return rms_norm_forward_f32(x, weight, y, rows, cols, eps,
                              c10::cuda::getCurrentCUDAStream(index).stream());
}

int dequantize_four_bit_on(const FourBitBlock& block, DequantizedType type, void* out, int device) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  return dequantize_four_bit(block, type, out, c10::cuda::getCurrentCUDAStream(index).stream());
}

int dequantize_int8_on(const Int8Block& block, DequantizedType type, void* out, int device) {
  const auto index = static_cast<c10::DeviceIndex>(device);
  const c10::cuda::CUDAGuard guard(index);
  return dequantize_int8(block, type, out, c10::cuda::getCurrentCUDAStream(index).stream());
}

Runtime make_table() {
  // The GPU check counts the host's synchronizations with the GPU per step: LibTorch warns on
  // each (an .item(), a blocking copy, a stream or device synchronize) when this is "warn".
  if (const char* mode = std::getenv("TESSERA_CUDA_SYNC_DEBUG");
      mode && std::strcmp(mode, "warn") == 0)
    c10::cuda::warning_state().set_sync_debug_mode(c10::cuda::SyncDebugMode::L_WARN);
  Runtime table;
  table.make_device_tier = &make_device_tier;
  table.device_memory = &device_memory;
  table.set_device = &set_device;
  table.has_nccl = nccl_built();
  table.make_nccl_backend = &make_nccl_backend;
  table.rms_norm_forward_f32 = &rms_norm_forward_on;
  table.dequantize_four_bit = &dequantize_four_bit_on;
  table.dequantize_int8 = &dequantize_int8_on;
  return table;
}

}  // namespace
}  // namespace tessera::cuda

// The loader asks with its own kRuntimeAbi; a table of another layout is not handed out.
extern "C" __attribute__((visibility("default"))) const tessera::cuda::Runtime*
tessera_cuda_runtime(int abi) {
  static const tessera::cuda::Runtime table = tessera::cuda::make_table();
  return abi == tessera::cuda::kRuntimeAbi ? &table : nullptr;
}
