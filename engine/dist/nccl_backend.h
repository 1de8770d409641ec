#pragma once
// Internal to engine/dist: the NCCL backend in a translation unit of its own (it pulls in the
// CUDA headers), compiled wherever the torch build has c10d with NCCL (USE_C10D_NCCL).
#include <chrono>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace tessera::dist {

bool nccl_compiled();

// A ProcessGroupNCCL over `store` (already prefixed for the group); its communicators are made
// on the first collective. Throws tessera::Error (Unsupported) in a build without NCCL.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout);

}  // namespace tessera::dist
