#pragma once
// The per-ISA bodies of the CPU Adam (cpu_adam.h). Each updates elements [0, count) of the
// arrays it is given (a thread's slice); the dispatcher splits the work. Private to optim/.
#include <cstdint>

#include "optim/cpu_adam.h"

namespace tessera::optim::detail {

// The update's scalars rounded to float once, exactly as torch rounds them when it applies
// each tensor op with a Python-float argument.
struct AdamScalars {
  float decay = 1.0f;  // 1 − lr·wd (applied only when `apply_decay`)
  bool apply_decay = false;
  float lerp_weight = 0.1f;       // 1 − β1
  bool lerp_small_weight = true;  // torch's lerp: weight < 0.5 uses start + w·(end − start)
  float beta2 = 0.999f;
  float one_minus_beta2 = 0.001f;
  float bias_correction2_sqrt = 1.0f;
  float eps = 1e-8f;
  float neg_step_size = -1e-3f;  // −lr / (1 − β1ᵗ)
};

AdamScalars adam_scalars(const AdamHyper& hyper);

void adam_scalar(const AdamArrays& a, const AdamScalars& s);
void adam_avx2(const AdamArrays& a, const AdamScalars& s);
void adam_avx512(const AdamArrays& a, const AdamScalars& s);

// float → bf16 / fp16 bit patterns as c10::BFloat16 / c10::Half round them (nearest even).
std::uint16_t float_to_bf16_bits(float value);
std::uint16_t float_to_fp16_bits(float value);

}  // namespace tessera::optim::detail
