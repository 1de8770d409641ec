#pragma once
// A GPU's memory as the CUDA caching allocator and the driver see it, for the `memory` events'
// device tier: what LibTorch's tensors hold, what the allocator keeps reserved for them, the
// peak since the process started, and the card's total and free memory.
#include <c10/core/Device.h>

#include <cstdint>
#include <optional>

namespace tessera::train {

struct DeviceMemory {
  std::uint64_t allocated = 0;       // bytes in live tensors
  std::uint64_t reserved = 0;        // bytes the caching allocator holds (allocated + cached)
  std::uint64_t peak_allocated = 0;  // since the process started
  std::uint64_t total = 0;           // the card's memory (cudaMemGetInfo)
  std::uint64_t free = 0;            // free on the card, every process counted
};

// Nothing for a device that is not a CUDA GPU, or without the CUDA module (cuda/runtime.h).
std::optional<DeviceMemory> device_memory(c10::Device device);

}  // namespace tessera::train
