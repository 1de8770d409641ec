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

TESSERA_AVX512 void four_bit_blocks_to_bf16_avx512(const std::uint8_t* packed, const float* absmax,
                                                   std::size_t blocks, std::size_t block,
                                                   const float* code, std::uint16_t* out) {
  // Sixteen codes make a block's every value: its table of code[i] × absmax rounded to bf16 is
  // built once, and each value is then a 16-bit lookup (vpermw) — the same product and rounding
  // per value as the scalar path, a fraction of the work.
  const __m512 codes = _mm512_loadu_ps(code);
  const __m512i low_nibble = _mm512_set1_epi16(0x0F);
  // A byte's high nibble is the earlier value: interleave the high and the low nibbles' values.
  alignas(64) static const std::uint16_t kFirst[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                       37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                       11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const std::uint16_t kSecond[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                        53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                        27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i first = _mm512_load_si512(kFirst);
  const __m512i second = _mm512_load_si512(kSecond);
  const std::size_t chunks = block / 64;  // 32 packed bytes → 64 values
  for (std::size_t b = 0; b < blocks; ++b) {
    const __m512i table =
        _mm512_zextsi256_si512(avx512_to_bf16(_mm512_mul_ps(codes, _mm512_set1_ps(absmax[b]))));
    for (std::size_t c = 0; c < chunks; ++c) {
      const __m512i bytes = _mm512_cvtepu8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed + 32 * c)));
      const __m512i high = _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table);
      const __m512i low = _mm512_permutexvar_epi16(_mm512_and_si512(bytes, low_nibble), table);
      _mm512_storeu_si512(out + 64 * c, _mm512_permutex2var_epi16(high, first, low));
      _mm512_storeu_si512(out + 64 * c + 32, _mm512_permutex2var_epi16(high, second, low));
    }
    packed += block / 2;
    out += block;
  }
}

}  // namespace tessera::quant::detail
