#include "train/device_memory.h"

#include "cuda/runtime.h"

namespace tessera::train {

std::optional<DeviceMemory> device_memory(c10::Device device) {
  const cuda::Runtime* runtime = cuda::runtime();
  if (!device.is_cuda() || runtime == nullptr) return std::nullopt;
  DeviceMemory m;
  if (!runtime->device_memory(device.has_index() ? device.index() : 0, m)) return std::nullopt;
  return m;
}

}  // namespace tessera::train
