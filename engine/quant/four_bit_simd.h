#pragma once
// The SIMD bodies of engine/quant/four_bit.cpp, chosen at run time by what the CPU has.
#include <cstddef>
#include <cstdint>

namespace tessera::quant::detail {

bool cpu_has_avx512();  // AVX-512 F and BW

// `blocks` whole blocks of `block` values (a multiple of 64), block b's packed bytes (high nibble
// first) at packed + b·block/2 → code[index] × absmax[b] as bfloat16 bit patterns. Only on a CPU
// with cpu_has_avx512().
void four_bit_blocks_to_bf16_avx512(const std::uint8_t* packed, const float* absmax,
                                    std::size_t blocks, std::size_t block, const float* code,
                                    std::uint16_t* out);

}  // namespace tessera::quant::detail
