#pragma once
// One value of a quantized block (cuda/kernels.h's FourBitBlock, Int8Block) in float32: what
// the CUDA kernels (dequantize.cu) compute for each element, written once for the device and the
// host so that test_model checks its indexing (nibble order, block and nested-absmax indices)
// against the CPU's loops on machines without a GPU. Plain C++17 outside nvcc.
#include <cstdint>

#include "cuda/kernels.h"

#if defined(__CUDACC__)
#define TESSERA_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define TESSERA_HOST_DEVICE inline
#endif

namespace tessera::cuda {

// a × b and a + b rounded each, never contracted into a fused multiply-add: the CPU's loops
// (engine/quant, compiled with -ffp-contract=off) round after each. On the host the translation
// units that include this target baseline x86-64 or AArch64 without -ffast-math: GCC contracts
// only where the target has FMA instructions, and none is named for them.
TESSERA_HOST_DEVICE float multiply_rounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
TESSERA_HOST_DEVICE float add_rounded(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Element `at` of the whole row-major weight (row × region.in_features + column), `code` the 16
// values of a nibble (block.code, or a copy of it in shared memory).
TESSERA_HOST_DEVICE float four_bit_value(const FourBitBlock& block, const float* code,
                                         std::int64_t at) {
  const unsigned byte = block.codes[at >> 1];
  const unsigned nibble = (at & 1) != 0 ? (byte & 15u) : (byte >> 4);  // the first value high
  const std::int64_t index = at / block.blocksize;
  const float absmax =
      block.absmax != nullptr
          ? block.absmax[index]
          : add_rounded(multiply_rounded(block.nested_code[block.nested_codes[index]],
                                         block.nested_scales[index / block.nested_blocksize]),
                        block.nested_offset);
  return multiply_rounded(code[nibble], absmax);
}

// Element (row, column) of the whole weight.
TESSERA_HOST_DEVICE float int8_value(const Int8Block& block, std::int64_t row,
                                     std::int64_t column) {
  const float q = static_cast<float>(block.codes[row * block.region.in_features + column]);
  return multiply_rounded(multiply_rounded(q, block.row_absmax[row]), block.inverse_127);
}

}  // namespace tessera::cuda
