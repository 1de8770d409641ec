// Dispatch, threading and the scalar body of the CPU Adam (cpu_adam.h). The SIMD bodies are in
// cpu_adam_simd.cpp; all three do the same float operations in the same order, so every level
// gives the same bits (sqrt and division are correctly rounded everywhere; torch's lerp and
// addcmul are fused multiply-adds, so ours are too).
#include "optim/cpu_adam.h"

#include <ATen/Parallel.h>

#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"
#include "core/parallel.h"
#include "optim/cpu_adam_kernels.h"

namespace tessera::optim {

namespace {

// Below this many elements a thread's share is too small to pay for waking it.
constexpr std::int64_t kGrainElements = 1 << 15;

SimdLevel hardware_simd_level() {
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wide registers (XGETBV).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw"))
    return SimdLevel::Avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c"))
    return SimdLevel::Avx2;
  return SimdLevel::Scalar;
}

SimdLevel capped_level() {
  SimdLevel level = hardware_simd_level();
  if (const char* cap = std::getenv("TESSERA_CPU_ADAM_ISA")) {
    const std::string want(cap);
    SimdLevel limit = level;
    if (want == "scalar") limit = SimdLevel::Scalar;
    if (want == "avx2") limit = SimdLevel::Avx2;
    if (want == "avx512") limit = SimdLevel::Avx512;
    if (static_cast<int>(limit) < static_cast<int>(level)) level = limit;
  }
  return level;
}

}  // namespace

SimdLevel detected_simd_level() {
  static const SimdLevel level = capped_level();
  return level;
}

bool simd_level_supported(SimdLevel level) {
  static const SimdLevel hardware = hardware_simd_level();
  return static_cast<int>(level) <= static_cast<int>(hardware);
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::Scalar:
      return "scalar";
    case SimdLevel::Avx2:
      return "avx2";
    case SimdLevel::Avx512:
      return "avx512";
  }
  return "unknown";
}

void cpu_adamw_step(const AdamArrays& arrays, const AdamHyper& hyper) {
  cpu_adamw_step(arrays, hyper, detected_simd_level());
}

void cpu_adamw_step(const AdamArrays& arrays, const AdamHyper& hyper, SimdLevel level,
                    int threads) {
  if (!simd_level_supported(level))
    throw Error(ErrorKind::Internal, std::string("CPU Adam: this CPU cannot run the ") +
                                         simd_level_name(level) + " kernel");
  if (arrays.count < 0 || hyper.step < 1)
    throw Error(ErrorKind::Internal, "CPU Adam: negative count or step < 1");
  if (arrays.count == 0) return;
  if (arrays.copy_kind != LowPrecisionCopy::None && arrays.copy == nullptr)
    throw Error(ErrorKind::Internal, "CPU Adam: a low-precision copy was asked for without memory");
  const detail::AdamScalars scalars = detail::adam_scalars(hyper);
  auto body = level == SimdLevel::Avx512 ? &detail::adam_avx512
              : level == SimdLevel::Avx2 ? &detail::adam_avx2
                                         : &detail::adam_scalar;
  // torch's intra-op thread count (torch::set_num_threads) unless given, on our own pool
  // (core/parallel.h).
  core::parallel_for(arrays.count, kGrainElements, threads > 0 ? threads : at::get_num_threads(),
                     [&](std::int64_t begin, std::int64_t end) {
                       AdamArrays slice = arrays;
                       slice.param += begin;
                       slice.grad += begin;
                       slice.exp_avg += begin;
                       slice.exp_avg_sq += begin;
                       if (slice.copy != nullptr) slice.copy += begin;
                       slice.count = end - begin;
                       body(slice, scalars);
                     });
}

namespace detail {

AdamScalars adam_scalars(const AdamHyper& h) {
  const double t = static_cast<double>(h.step);
  const double bias_correction1 = 1.0 - std::pow(h.beta1, t);
  const double bias_correction2 = 1.0 - std::pow(h.beta2, t);
  AdamScalars s;
  s.apply_decay = h.weight_decay != 0.0;
  s.decay = static_cast<float>(1.0 - h.lr * h.weight_decay);
  const double weight = 1.0 - h.beta1;
  s.lerp_small_weight = weight < 0.5;
  // torch's lerp with weight ≥ 0.5 computes end + (weight − 1)·(end − start).
  s.lerp_weight = static_cast<float>(s.lerp_small_weight ? weight : weight - 1.0);
  s.beta2 = static_cast<float>(h.beta2);
  s.one_minus_beta2 = static_cast<float>(1.0 - h.beta2);
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  s.eps = static_cast<float>(h.eps);
  s.neg_step_size = static_cast<float>(-(h.lr / bias_correction1));
  return s;
}

std::uint16_t float_to_bf16_bits(float value) {
  if (std::isnan(value)) return 0x7FC0;  // c10::BFloat16's NaN
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t rounding = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

std::uint16_t float_to_fp16_bits(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  std::uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude >= 0x47800000u)  // ≥ 65536, inf or NaN
    return static_cast<std::uint16_t>(sign | (magnitude > 0x7F800000u ? 0x7E00u : 0x7C00u));
  if (magnitude < 0x38800000u) {  // below fp16's smallest normal: let the FPU round
    const float magic = std::bit_cast<float>(0x3F000000u);  // 0.5 shifts the bits into place
    const float shifted = std::bit_cast<float>(magnitude) + magic;
    return static_cast<std::uint16_t>(sign | (std::bit_cast<std::uint32_t>(shifted) - 0x3F000000u));
  }
  const std::uint32_t odd = (magnitude >> 13) & 1u;
  magnitude += 0xC8000FFFu + odd;  // rebias the exponent (−112 << 23), round to nearest even
  return static_cast<std::uint16_t>(sign | (magnitude >> 13));
}

void adam_scalar(const AdamArrays& a, const AdamScalars& s) {
  for (std::int64_t i = 0; i < a.count; ++i) {
    float p = a.param[i];
    const float g = a.grad[i];
    float m = a.exp_avg[i];
    float v = a.exp_avg_sq[i];
    if (s.apply_decay) p = p * s.decay;
    m = std::fma(s.lerp_weight, g - m, s.lerp_small_weight ? m : g);
    v = std::fma(s.one_minus_beta2 * g, g, v * s.beta2);
    const float denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    p = p + (s.neg_step_size * m) / denom;
    a.param[i] = p;
    a.exp_avg[i] = m;
    a.exp_avg_sq[i] = v;
    if (a.copy_kind == LowPrecisionCopy::Bf16) a.copy[i] = float_to_bf16_bits(p);
    if (a.copy_kind == LowPrecisionCopy::Fp16) a.copy[i] = float_to_fp16_bits(p);
  }
}

}  // namespace detail
}  // namespace tessera::optim
