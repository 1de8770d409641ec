#pragma once
// One tensor's (or one slice's) AdamW update on the CPU as Gemini makes it: the
// float32 gradient scaled by the clipping coefficient, then the fused CPU Adam over the float32
// masters (or the float32 parameters themselves) and the moments in place, writing the new
// values in the compute dtype where it is bf16 or fp16.
#include <torch/torch.h>

#include <cstdint>
#include <optional>

#include "optim/adamw.h"
#include "optim/cpu_adam.h"

namespace tessera::plugins {

struct CpuUpdateArrays {
  float* param = nullptr;  // float32: the masters, or the parameters when they are float32
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  // Where the new values go in the compute dtype, bf16 or fp16 (`copy_kind`); none: not written.
  std::uint16_t* low_precision_copy = nullptr;
  optim::LowPrecisionCopy copy_kind = optim::LowPrecisionCopy::None;
};

// The copy kind of a 16-bit compute dtype (None for float32).
inline optim::LowPrecisionCopy low_precision_copy_of(torch::Dtype dtype) {
  if (dtype == torch::kBFloat16) return optim::LowPrecisionCopy::Bf16;
  if (dtype == torch::kHalf) return optim::LowPrecisionCopy::Fp16;
  return optim::LowPrecisionCopy::None;
}

// `gradient`: float32, contiguous, the update's element count (scaled in place by `coef`).
// `threads`: the CPU Adam's (0: torch's intra-op setting, which a thread torch did not start
// does not see: a worker passes the count it was given).
inline void cpu_adamw_update(torch::Tensor gradient, const std::optional<torch::Tensor>& coef,
                             const CpuUpdateArrays& where, const optim::AdamWOptions& adamw,
                             double lr, bool decays, std::int64_t step, int threads = 0) {
  if (coef) gradient.mul_(*coef);
  optim::AdamArrays a;
  a.count = gradient.numel();
  a.grad = gradient.data_ptr<float>();
  a.param = where.param;
  a.exp_avg = where.exp_avg;
  a.exp_avg_sq = where.exp_avg_sq;
  if (where.low_precision_copy != nullptr) {
    a.copy = where.low_precision_copy;
    a.copy_kind = where.copy_kind;
  }
  optim::cpu_adamw_step(
      a, {lr, adamw.beta1, adamw.beta2, adamw.eps, decays ? adamw.weight_decay : 0.0, step},
      optim::detected_simd_level(), threads);
}

}  // namespace tessera::plugins
