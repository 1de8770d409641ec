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
// Blocks of 1 to 4 MiB (a small model's activations: 1024 tokens x 768 float32 is 3 MiB) stayed
// in glibc's heap, which then held about twice the live tensors at the peak (session 58:
// heaptrack's live peak 206 MB, the heap's resident set 416 MiB, a 57M llama under QLoRA). From
// 1 MiB, keeping 128 MiB (at 64 a step's blocks were mapped afresh often enough to cost LoRA 8%
// of its step; the blocks kept are resident at the peak, 256 added 110 MiB to the 92M gemini
// run's), one-off runs of 12 steps (tessera-cli run, 8 x 128 tokens, fp32): QLoRA's peak RSS
// 532 MiB against 748-781 (steps 1.37-1.38 s against 1.39-1.44), LoRA's on the same model 626-627
// against 788-817 (1.27-1.29 s against 1.22-1.27), the 92M gemini run's 1903 against 1871
// (3.64-3.81 s against 3.69-4.45).
// Torch-free header.
#include <cstddef>
#include <cstdint>

namespace tessera::train {

inline constexpr std::size_t kLargeCpuBlockBytes = 1u << 20;
// What a run keeps for reuse without a host budget; with one, nothing (every freed block leaves
// the resident set at once, the disk tier's host floor).
inline constexpr std::size_t kCpuBlockCacheBytes = 128u << 20;

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
