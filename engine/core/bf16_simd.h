#pragma once
// float → bfloat16 in AVX-512 registers, for the kernels that write bf16 (the CPU Adam's
// low-precision copies, QLoRA's dequantization): round to nearest even as torch does, NaN →
// 0x7FC0. Only for translation units that call it from functions compiled for AVX-512 (target
// attributes) and reached after a check of the CPU's features.
#include <immintrin.h>

namespace tessera::core {

// 16 floats → 16 bf16 bit patterns.
__attribute__((target("avx512f,avx512bw"))) inline __m256i avx512_to_bf16(__m512 x) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i odd = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounding = _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd);
  __m512i shifted = _mm512_srli_epi32(_mm512_add_epi32(bits, rounding), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  shifted = _mm512_mask_blend_epi32(nan, shifted, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(shifted);
}

}  // namespace tessera::core
