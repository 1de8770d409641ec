// The AVX-512 body of dequantize_four_bit_bf16 (four_bit.cpp calls it only when the CPU has
// AVX-512 F and BW): compiled for any x86-64 through function target attributes, no global -m
// flags. Each value is code[index] × the block's absmax in float32, as the scalar path computes
// it, then rounded to bfloat16 the same way.
// GCC 12 at -O3 reports the intrinsics' own _mm*_undefined_*() placeholders as "maybe
// uninitialized" (a known false positive); nothing of ours is.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include "quant/four_bit_simd.h"

#include <immintrin.h>

#include "core/bf16_simd.h"

namespace tessera::quant::detail {
#define TESSERA_AVX512 __attribute__((target("avx512f,avx512bw")))

using core::avx512_to_bf16;

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
  return has;
}

TESSERA_AVX512 void four_bit_to_bf16_avx512(const std::uint8_t* packed, std::size_t groups,
                                            float scale, const float* code, std::uint16_t* out) {
  const __m512 table = _mm512_loadu_ps(code);
  const __m512 factor = _mm512_set1_ps(scale);
  const __m512i low_nibble = _mm512_set1_epi32(0x0F);
  // A byte's high nibble is the earlier value: interleave the high and the low nibbles' values.
  const __m512i first = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  for (std::size_t g = 0; g < groups; ++g) {
    const __m512i bytes =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed + 16 * g)));
    const __m512 high =
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(bytes, 4), table), factor);
    const __m512 low =
        _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_and_si512(bytes, low_nibble), table), factor);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * g),
                        avx512_to_bf16(_mm512_permutex2var_ps(high, first, low)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32 * g + 16),
                        avx512_to_bf16(_mm512_permutex2var_ps(high, second, low)));
  }
}

}  // namespace tessera::quant::detail
