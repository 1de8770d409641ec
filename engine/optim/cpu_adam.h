#pragma once
// The CPU Adam: one fused pass over contiguous float32 arrays that applies decoupled weight
// decay, updates both moments and the master weights, and (optionally) writes the bf16 or
// fp16 compute copy, with the numerics of torch.optim.AdamW's single-tensor path
// (engine/optim/adamw.h gives the formulas). Per parameter it reads p, g, m, v (16 bytes) and
// writes p, m, v (12 bytes), + 2 bytes for a low-precision copy: the step is bound by memory
// bandwidth, so the kernels do each operation once, in registers, in torch's order (no FMA
// contraction, so results equal torch's rounding).
//
// Kernels: AVX-512 (F+BW), AVX2+FMA+F16C and scalar, chosen at run time from what the CPU and
// the OS support (CPUID + XGETBV); TESSERA_CPU_ADAM_ISA=scalar|avx2|avx512 caps the choice.
// Work is split over as many threads as torch's intra-op setting (torch::set_num_threads), on
// core/parallel.h's pool.
// This header is torch-free: the plugins call it on raw chunk memory.
#include <cstdint>

namespace tessera::optim {

enum class SimdLevel { Scalar, Avx2, Avx512 };

// The widest level this CPU and OS run, capped by TESSERA_CPU_ADAM_ISA when set (an unknown
// value is ignored). Computed once.
SimdLevel detected_simd_level();
const char* simd_level_name(SimdLevel level);  // "scalar" | "avx2" | "avx512"
// True when this machine can run `level` (Scalar always).
bool simd_level_supported(SimdLevel level);

enum class LowPrecisionCopy { None, Bf16, Fp16 };

// The scalars of one update (t = `step`, counted from 1), as torch.optim.AdamW takes them.
struct AdamHyper {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  std::int64_t step = 1;
};

// The arrays of one update; all have `count` elements and may not overlap.
struct AdamArrays {
  float* param = nullptr;         // fp32 master weights, updated in place
  const float* grad = nullptr;    // fp32 gradient
  float* exp_avg = nullptr;       // first moment, updated in place
  float* exp_avg_sq = nullptr;    // second moment, updated in place
  std::uint16_t* copy = nullptr;  // optional bf16/fp16 copy of the new param (bit patterns)
  LowPrecisionCopy copy_kind = LowPrecisionCopy::None;
  std::int64_t count = 0;
};

// One AdamW update with the detected level, split over torch's intra-op threads.
void cpu_adamw_step(const AdamArrays& arrays, const AdamHyper& hyper);
// Same with an explicit level (tests and benchmarks; `level` must be supported) and thread count
// (0: torch's intra-op setting, which a thread torch did not start does not see).
void cpu_adamw_step(const AdamArrays& arrays, const AdamHyper& hyper, SimdLevel level,
                    int threads = 0);

}  // namespace tessera::optim
