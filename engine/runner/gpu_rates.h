#pragma once
// A GPU's copy and compute rates, measured for the hardware profile (plan::GpuRates) with
// LibTorch on the GPU itself: copies of `copy_bytes` between pinned host memory and the GPU in
// each direction, and n×n×n matrix products in bf16 and fp32 (TF32 off, as the engine computes
// fp32), each the median of 5 timed runs after a warm-up, timed by the host clock around a
// device synchronisation. About a second on a current GPU; the profile caches it a day.
#include <cstdint>

#include "plan/profile.h"

namespace tessera::runner {

inline constexpr std::uint64_t kGpuCopyTestBytes = 256ull << 20;
inline constexpr std::int64_t kGpuGemmSize = 4096;

// Not measured (rates.measured false, the method saying why) when LibTorch sees no such GPU.
plan::GpuRates measure_gpu_rates(int index, std::uint64_t copy_bytes = kGpuCopyTestBytes,
                                 std::int64_t gemm_size = kGpuGemmSize);

}  // namespace tessera::runner

namespace tessera::runner {

// The CPU's fp32 matrix-product rate: n×n×n products with LibTorch, the larger of the best of 5
// on all its threads (wall clock) and one thread's best of 3 over its own CPU time × the cores
// it would use × kCpuThreadScaling. On an idle machine the two agree (the all-threads figure
// 0.98 × cores × one thread's on a 2-core AMD EPYC); with another process busy on the cores the
// all-threads figure fell to 0.30-0.55 of that there, the one-thread figure not at all, so a
// measurement taken while the machine is busy is not cached for a day at half the truth.
// About 0.2 s.
// With it, the fused CPU Adam's elements a second (bf16 copy written, as gemini's update of
// host shards beside a GPU in bf16): kCpuAdamElements-element arrays, far larger than a cache,
// best of 3 on every thread after a warm-up (about 0.2 s more).
inline constexpr std::int64_t kCpuGemmSize = 1024;
inline constexpr std::int64_t kCpuAdamElements = 8 << 20;
inline constexpr double kCpuThreadScaling = 0.95;
plan::CpuRate measure_cpu_rate(int physical_cores, std::int64_t gemm_size = kCpuGemmSize);

}  // namespace tessera::runner
