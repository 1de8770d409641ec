#pragma once
// LibTorch's CPU tensors of kLargeCpuBlockBytes and more come from here: mapped from the kernel
// and, once freed, kept for the next request of about their size (a HostBlockPool over
// mmap/munmap), up to a bound on the bytes kept, beyond which the largest go back at once.
//
// Why: glibc's heap either keeps freed activations resident (its mmap threshold slides up to
// 32 MiB, and a step's peak then depends on how the heap was reused: 15-25% above what the live
// tensors need for gemini's ranks) or, with the threshold fixed, maps every large block afresh,
// page-faulting each step's activations anew (15-24% of gemini's tokens/s). A step allocates the
// same sizes every time, so a small cache of freed blocks serves nearly all of them: a 92M llama
// under gemini in one process trained at glibc's default speed (254-263 tokens/s against 253-265)
// with the fixed threshold's peak (1851 MiB against 1842; 2197-2244 by default), keeping 64 MiB.
// Torch-free header.
#include <cstddef>
#include <cstdint>

namespace tessera::train {

inline constexpr std::size_t kLargeCpuBlockBytes = 4u << 20;
// What a run keeps for reuse without a host budget; with one, nothing (every freed block leaves
// the resident set at once, the disk tier's host floor).
inline constexpr std::size_t kCpuBlockCacheBytes = 64u << 20;

// Makes the cache LibTorch's CPU allocator (once in a process; a later call only changes the
// bound), keeping at most `keep_bytes` of freed blocks. Tensors made before keep their memory.
void install_cpu_block_cache(std::size_t keep_bytes);

struct CpuBlockCacheFigures {
  bool installed = false;
  std::uint64_t in_use = 0;       // bytes of large blocks held by tensors
  std::uint64_t kept = 0;         // bytes of freed large blocks kept for reuse
  std::uint64_t allocations = 0;  // large blocks mapped from the kernel so far
};
CpuBlockCacheFigures cpu_block_cache_figures();

}  // namespace tessera::train
