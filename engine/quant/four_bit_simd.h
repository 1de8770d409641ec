#pragma once
// The SIMD bodies of engine/quant/four_bit.cpp, chosen at run time by what the CPU has.
#include <cstddef>
#include <cstdint>

namespace tessera::quant::detail {

bool cpu_has_avx512();  // AVX-512 F and BW

// `groups` × 16 packed bytes (32 values, high nibble first) → code[index] × scale as bfloat16
// bit patterns. Only on a CPU with cpu_has_avx512().
void four_bit_to_bf16_avx512(const std::uint8_t* packed, std::size_t groups, float scale,
                             const float* code, std::uint16_t* out);

}  // namespace tessera::quant::detail
