#pragma once
// Page-locked host blocks kept at their own sizes and reused once the copies that used them are
// done: the host side of a GPU's device tier (allocate_host, allocate_host_io). LibTorch's
// caching host allocator rounds every block up to a power of two and keeps it for the process's
// life, so a gemini shard's staging of 96 MiB would hold 128 MiB of locked memory that neither
// the plan nor the memory events count. Here a block is its size rounded to a page; one given
// back is reused for a request of its size (or up to an eighth less), which is every step's
// after the first (a gemini run's chunks repeat their sizes). What the pool keeps between uses
// is counted (Figures), so the memory events can name it.
//
// Torch-free and CUDA-free: the memory comes from and goes back through the functions it is
// made with (cudaHostAlloc and cudaFreeHost on a GPU), and whether a block's copies are done is
// asked of the function it is given back with (its copy streams' events), so the tests drive
// it on the CPU.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

namespace tessera::train {

class HostBlockPool {
 public:
  static constexpr std::size_t kPage = 4096;
  // `allocate(bytes)`: page-aligned page-locked memory of `bytes` (a multiple of kPage), or
  // throws; `release(memory, bytes)`: returns it to the system (must not throw).
  HostBlockPool(std::function<void*(std::size_t)> allocate,
                std::function<void(void*, std::size_t)> release);
  // Releases every block kept. The pool must outlive the blocks taken from it (a GPU's tier
  // shares it with each of them).
  ~HostBlockPool();
  HostBlockPool(const HostBlockPool&) = delete;
  HostBlockPool& operator=(const HostBlockPool&) = delete;

  // A page-aligned block of at least `bytes`: a kept one whose copies are done, of `bytes`
  // rounded up to a page or at most an eighth more, else a new one. Where the system refuses a
  // new one, the kept blocks whose copies are done are released and it is asked once more.
  void* take(std::size_t bytes);
  // The block `memory` (from take) back to the pool; reused once `copies_done()` is true.
  void give_back(void* memory, std::function<bool()> copies_done);

  struct Figures {
    std::uint64_t taken = 0;        // bytes of the blocks taken and not given back
    std::uint64_t kept = 0;         // bytes of the blocks given back and kept for reuse
    std::uint64_t allocations = 0;  // blocks asked of the system so far
  };
  Figures figures() const;

  static std::size_t rounded(std::size_t bytes) {
    return (std::max<std::size_t>(bytes, 1) + kPage - 1) / kPage * kPage;
  }

 private:
  struct Kept {
    void* memory;
    std::function<bool()> copies_done;
  };
  // Releases the kept blocks whose copies are done; the lock is held.
  std::size_t release_done_locked();

  std::function<void*(std::size_t)> allocate_;
  std::function<void(void*, std::size_t)> release_;
  mutable std::mutex mutex_;
  std::map<void*, std::size_t> taken_;     // by address: its size
  std::multimap<std::size_t, Kept> kept_;  // by size
  Figures figures_;
};

}  // namespace tessera::train
