// NCCL's process groups, for collectives on CUDA tensors (dist/nccl_backend.h calls them through
// the CUDA runtime module). USE_C10D_NCCL comes with a LibTorch built with NCCL.
#ifdef USE_C10D_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#else
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif

#include <cstdlib>

#include "core/error.h"
#include "cuda/module/module.h"

namespace tessera::cuda {

bool nccl_built() {
#ifdef USE_C10D_NCCL
  return true;
#else
  return false;
#endif
}

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store,
                                                    int rank, int size,
                                                    std::chrono::milliseconds timeout) {
#ifdef USE_C10D_NCCL
  // A collective that outlives the timeout (a peer died: its partners' kernels wait for it) makes
  // NCCL's watchdog abort the communicators and, by default, end the process, so that the run
  // dies of SIGABRT instead of reporting which peer failed. CleanUpOnly (2) only aborts them:
  // the stuck kernels end, and the next collective fails as on Gloo, where ParallelContext names
  // the silent peer (PeerFailure). A value the user set is kept. (Read when the group is made.)
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, size, options);
#else
  (void)store, (void)rank, (void)size, (void)timeout;
  throw Error(ErrorKind::Unsupported,
              "collectives on CUDA tensors need NCCL, and this build of LibTorch has none",
              "use a CUDA build of LibTorch (the x86_64 torch wheel), or keep tensors on the CPU "
              "for Gloo");
#endif
}

}  // namespace tessera::cuda
