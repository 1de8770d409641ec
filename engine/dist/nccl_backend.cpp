#include "dist/nccl_backend.h"

#include "core/error.h"
#include "cuda/runtime.h"

namespace tessera::dist {

bool nccl_compiled() {
  const cuda::Runtime* runtime = cuda::runtime();
  return runtime != nullptr && runtime->has_nccl;
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
  const cuda::Runtime* runtime = cuda::runtime();
  if (runtime == nullptr)
    throw_unsupported("collectives on CUDA tensors need NCCL, in Tessera's CUDA module, which is " +
                          cuda::runtime_status(),
                      "run on a machine with an NVIDIA GPU and its driver, or keep tensors on the "
                      "CPU for Gloo");
  return runtime->make_nccl_backend(store, rank, size, timeout);
}

}  // namespace tessera::dist
