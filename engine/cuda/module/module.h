#pragma once
// Internal to the CUDA runtime module (cuda/runtime.h): the functions its table points at.
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <cstdint>
#include <memory>

#include "cuda/runtime.h"

namespace tessera::cuda {

std::unique_ptr<train::DeviceTier> make_device_tier(int index, std::uint64_t budget);
bool nccl_built();
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);

}  // namespace tessera::cuda
