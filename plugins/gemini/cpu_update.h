#pragma once
// One tensor's (or one slice's) AdamW update on the CPU as Gemini makes it: the
// float32 gradient scaled by the clipping coefficient, then the fused CPU Adam over the float32
// masters (or the float32 parameters themselves) and the moments in place, writing the new
// values in bf16 where the compute copy is bf16.
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
  std::uint16_t* bf16_copy = nullptr;  // where the new values go in bf16 (none: not written)
};

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
  if (where.bf16_copy != nullptr) {
    a.copy = where.bf16_copy;
    a.copy_kind = optim::LowPrecisionCopy::Bf16;
  }
  optim::cpu_adamw_step(
      a, {lr, adamw.beta1, adamw.beta2, adamw.eps, decays ? adamw.weight_decay : 0.0, step},
      optim::detected_simd_level(), threads);
}

}  // namespace tessera::plugins
