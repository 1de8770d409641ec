// AVX2 and AVX-512 bodies of the CPU Adam. Compiled for any x86-64 (function target
// attributes, no global -m flags) and only called when the CPU has the ISA (cpu_adam.cpp).
// Each vector does the operations of adam_scalar in the same order; the tails go through the
// same vector code on padded copies (AVX2) or masks (AVX-512), never a different formula.
// GCC 12 at -O3 reports the intrinsics' own _mm*_undefined_*() placeholders as "maybe
// uninitialized" (a known false positive); nothing of ours is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "core/bf16_simd.h"
#include "optim/cpu_adam_kernels.h"

namespace tessera::optim::detail {

#define TESSERA_AVX2 __attribute__((target("avx2,fma,f16c")))
#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))

namespace {

struct Avx2Consts {
  __m256 decay, lerp_weight, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size;
};

TESSERA_AVX2 inline Avx2Consts avx2_consts(const AdamScalars& s) {
  return {_mm256_set1_ps(s.decay),
          _mm256_set1_ps(s.lerp_weight),
          _mm256_set1_ps(s.beta2),
          _mm256_set1_ps(s.one_minus_beta2),
          _mm256_set1_ps(s.bias_correction2_sqrt),
          _mm256_set1_ps(s.eps),
          _mm256_set1_ps(s.neg_step_size)};
}

// 8 float bit patterns → 8 bf16 bit patterns (round to nearest even, NaN → 0x7FC0).
TESSERA_AVX2 inline __m128i avx2_to_bf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounding = _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd);
  __m256i shifted = _mm256_srli_epi32(_mm256_add_epi32(bits, rounding), 16);
  const __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  shifted = _mm256_blendv_epi8(shifted, _mm256_set1_epi32(0x7FC0), _mm256_castps_si256(nan));
  // Pack the 32-bit lanes to 16 bits (no saturation: every value is ≤ 0xFFFF) in order.
  const __m256i packed = _mm256_packus_epi32(shifted, shifted);
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(packed, 0x08));
}

// One vector of the update; returns the new param.
TESSERA_AVX2 inline __m256 avx2_update(__m256 p, __m256 g, __m256& m, __m256& v,
                                       const Avx2Consts& c, const AdamScalars& s) {
  if (s.apply_decay) p = _mm256_mul_ps(p, c.decay);
  const __m256 diff = _mm256_sub_ps(g, m);
  m = _mm256_fmadd_ps(c.lerp_weight, diff, s.lerp_small_weight ? m : g);
  v = _mm256_fmadd_ps(_mm256_mul_ps(c.one_minus_beta2, g), g, _mm256_mul_ps(v, c.beta2));
  const __m256 denom =
      _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), c.bias_correction2_sqrt), c.eps);
  return _mm256_add_ps(p, _mm256_div_ps(_mm256_mul_ps(c.neg_step_size, m), denom));
}

TESSERA_AVX2 inline void avx2_store_copy(std::uint16_t* out, __m256 p, LowPrecisionCopy kind) {
  if (kind == LowPrecisionCopy::Bf16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out), avx2_to_bf16(p));
  else if (kind == LowPrecisionCopy::Fp16)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out),
                     _mm256_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

}  // namespace

TESSERA_AVX2 void adam_avx2(const AdamArrays& a, const AdamScalars& s) {
  const Avx2Consts c = avx2_consts(s);
  std::int64_t i = 0;
  for (; i + 8 <= a.count; i += 8) {
    __m256 m = _mm256_loadu_ps(a.exp_avg + i);
    __m256 v = _mm256_loadu_ps(a.exp_avg_sq + i);
    const __m256 p =
        avx2_update(_mm256_loadu_ps(a.param + i), _mm256_loadu_ps(a.grad + i), m, v, c, s);
    _mm256_storeu_ps(a.param + i, p);
    _mm256_storeu_ps(a.exp_avg + i, m);
    _mm256_storeu_ps(a.exp_avg_sq + i, v);
    if (a.copy_kind != LowPrecisionCopy::None) avx2_store_copy(a.copy + i, p, a.copy_kind);
  }
  const std::int64_t rest = a.count - i;
  if (rest == 0) return;
  // The tail: padded copies through the same vector code.
  alignas(32) float p_buf[8] = {}, g_buf[8] = {}, m_buf[8] = {}, v_buf[8] = {};
  alignas(16) std::uint16_t copy_buf[8] = {};
  const std::size_t bytes = static_cast<std::size_t>(rest) * sizeof(float);
  std::memcpy(p_buf, a.param + i, bytes);
  std::memcpy(g_buf, a.grad + i, bytes);
  std::memcpy(m_buf, a.exp_avg + i, bytes);
  std::memcpy(v_buf, a.exp_avg_sq + i, bytes);
  __m256 m = _mm256_load_ps(m_buf);
  __m256 v = _mm256_load_ps(v_buf);
  const __m256 p = avx2_update(_mm256_load_ps(p_buf), _mm256_load_ps(g_buf), m, v, c, s);
  _mm256_store_ps(p_buf, p);
  _mm256_store_ps(m_buf, m);
  _mm256_store_ps(v_buf, v);
  std::memcpy(a.param + i, p_buf, bytes);
  std::memcpy(a.exp_avg + i, m_buf, bytes);
  std::memcpy(a.exp_avg_sq + i, v_buf, bytes);
  if (a.copy_kind != LowPrecisionCopy::None) {
    avx2_store_copy(copy_buf, p, a.copy_kind);
    std::memcpy(a.copy + i, copy_buf, static_cast<std::size_t>(rest) * sizeof(std::uint16_t));
  }
}

using core::avx512_to_bf16;

TESSERA_AVX512 void adam_avx512(const AdamArrays& a, const AdamScalars& s) {
  const __m512 decay = _mm512_set1_ps(s.decay);
  const __m512 lerp_weight = _mm512_set1_ps(s.lerp_weight);
  const __m512 beta2 = _mm512_set1_ps(s.beta2);
  const __m512 one_minus_beta2 = _mm512_set1_ps(s.one_minus_beta2);
  const __m512 bias_correction2_sqrt = _mm512_set1_ps(s.bias_correction2_sqrt);
  const __m512 eps = _mm512_set1_ps(s.eps);
  const __m512 neg_step_size = _mm512_set1_ps(s.neg_step_size);
  for (std::int64_t i = 0; i < a.count; i += 16) {
    const std::int64_t left = a.count - i;
    // All lanes in the body; the first `left` lanes in the tail. Masked-off lanes read zeros.
    const __mmask16 mask =
        left >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << left) - 1u);
    __m512 p = _mm512_maskz_loadu_ps(mask, a.param + i);
    const __m512 g = _mm512_maskz_loadu_ps(mask, a.grad + i);
    __m512 m = _mm512_maskz_loadu_ps(mask, a.exp_avg + i);
    __m512 v = _mm512_maskz_loadu_ps(mask, a.exp_avg_sq + i);
    if (s.apply_decay) p = _mm512_mul_ps(p, decay);
    const __m512 diff = _mm512_sub_ps(g, m);
    m = _mm512_fmadd_ps(lerp_weight, diff, s.lerp_small_weight ? m : g);
    v = _mm512_fmadd_ps(_mm512_mul_ps(one_minus_beta2, g), g, _mm512_mul_ps(v, beta2));
    const __m512 denom =
        _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(v), bias_correction2_sqrt), eps);
    p = _mm512_add_ps(p, _mm512_div_ps(_mm512_mul_ps(neg_step_size, m), denom));
    _mm512_mask_storeu_ps(a.param + i, mask, p);
    _mm512_mask_storeu_ps(a.exp_avg + i, mask, m);
    _mm512_mask_storeu_ps(a.exp_avg_sq + i, mask, v);
    if (a.copy_kind == LowPrecisionCopy::Bf16)
      _mm256_mask_storeu_epi16(a.copy + i, mask, avx512_to_bf16(p));
    else if (a.copy_kind == LowPrecisionCopy::Fp16)
      _mm256_mask_storeu_epi16(a.copy + i, mask,
                               _mm512_cvtps_ph(p, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

}  // namespace tessera::optim::detail
