#pragma once
// Internal to engine/dist: the NCCL backend, which the CUDA runtime module (cuda/runtime.h)
// provides where it is loaded and LibTorch has NCCL.
#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tessera::dist {

// Whether the CUDA module is loaded and its LibTorch has NCCL.
bool nccl_compiled();

// A ProcessGroupNCCL over `store` (already prefixed for the group); its communicators are made
// on the first collective. Throws tessera::Error (Unsupported) without it.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);

}  // namespace tessera::dist
