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
