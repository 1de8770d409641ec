#include "train/device_memory.h"

#if defined(TESSERA_HAVE_CUDA_KERNELS)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

namespace tessera::train {

std::optional<DeviceMemory> device_memory(c10::Device device) {
#if defined(TESSERA_HAVE_CUDA_KERNELS)
  if (!device.is_cuda()) return std::nullopt;
  const c10::DeviceIndex index = device.has_index() ? device.index() : 0;
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  // Index 0 of each StatArray is StatType::AGGREGATE (every pool), in every LibTorch version.
  DeviceMemory m;
  m.allocated = static_cast<std::uint64_t>(stats.allocated_bytes[0].current);
  m.reserved = static_cast<std::uint64_t>(stats.reserved_bytes[0].current);
  m.peak_allocated = static_cast<std::uint64_t>(stats.allocated_bytes[0].peak);
  c10::cuda::CUDAGuard guard(index);
  std::size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
    m.free = free;
    m.total = total;
  }
  return m;
#else
  (void)device;
  return std::nullopt;
#endif
}

}  // namespace tessera::train
