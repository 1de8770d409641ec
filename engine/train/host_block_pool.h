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
// The CPU's large tensor blocks are kept the same way, over mmap and munmap, with a bound on what
// is kept (cpu_block_cache.h).
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
#include <utility>
#include <vector>

namespace tessera::train {

class HostBlockPool {
 public:
  static constexpr std::size_t kPage = 4096;
  // `allocate(bytes)`: memory aligned to `page`, page-locked, of `bytes` (a multiple of `page`),
  // or throws; `release(memory, bytes, copies_done)`: returns it to the system, first waiting for
  // the copies where they may not be done (must not throw). `page`: the system's page size (a
  // multiple of kPage at least), so that two blocks never share a page, which is locked whole.
  HostBlockPool(std::function<void*(std::size_t)> allocate,
                std::function<void(void*, std::size_t, bool)> release, std::size_t page = kPage);
  // Releases every block kept. The pool must outlive the blocks taken from it (a GPU's tier
  // shares it with each of them).
  ~HostBlockPool();
  HostBlockPool(const HostBlockPool&) = delete;
  HostBlockPool& operator=(const HostBlockPool&) = delete;

  // A page-aligned block of at least `bytes`: a kept one whose copies are done, of `bytes`
  // rounded up to a page or at most an eighth more, else a new one. Where the system refuses a
  // new one, the kept blocks whose copies are done are released and it is asked once more.
  void* take(std::size_t bytes);
  // The block `memory` (from take) back to the pool; reused once `copies_done()` is true. False
  // (and nothing done) where `memory` is not a block taken from this pool.
  bool give_back(void* memory, std::function<bool()> copies_done);
  // Releases the kept blocks whose copies are done (those of a phase that is over: training's
  // buffers before the export, a staging replaced by a larger one); returns their bytes.
  std::size_t release_kept();
  // Keeps at most `bytes` of blocks for reuse from now on (unbounded until this is called): a
  // block given back beyond it releases the largest kept ones whose copies are done.
  void keep_at_most(std::size_t bytes);

  struct Figures {
    std::uint64_t taken = 0;        // bytes of the blocks taken and not given back
    std::uint64_t kept = 0;         // bytes of the blocks given back and kept for reuse
    std::uint64_t allocations = 0;  // blocks asked of the system so far
  };
  Figures figures() const;

  // `bytes` rounded up to whole pages (what a block of that request holds).
  std::size_t rounded(std::size_t bytes) const {
    return (std::max<std::size_t>(bytes, 1) + page_ - 1) / page_ * page_;
  }
  std::size_t page() const { return page_; }

 private:
  struct Kept {
    void* memory;
    std::function<bool()> copies_done;
  };

  std::function<void*(std::size_t)> allocate_;
  std::function<void(void*, std::size_t, bool)> release_;
  std::size_t page_;
  mutable std::mutex mutex_;
  std::map<void*, std::size_t> taken_;     // by address: its size
  std::multimap<std::size_t, Kept> kept_;  // by size
  Figures figures_;
  std::size_t keep_at_most_ = SIZE_MAX;
  // Under the lock: the kept blocks beyond keep_at_most_, largest first, taken out of kept_ to be
  // released outside it.
  std::vector<std::pair<void*, std::size_t>> take_beyond_bound();
};

}  // namespace tessera::train
