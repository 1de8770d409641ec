#pragma once
// 4-bit block quantization of frozen weights for QLoRA (issue 27), in bitsandbytes' formats so
// that its checkpoints load and its quantization is reproduced byte for byte: a tensor's values,
// flattened, in blocks of `blocksize` (64 by default), each block scaled by its largest
// magnitude (absmax, float32) into [-1, 1] and each value replaced by the index of the nearest
// of 16 codes — NF4 (quantiles of a normal distribution, QLoRA's) or FP4 (1 sign, 2 exponent,
// 1 mantissa bit) — two indices a byte, the first in the high nibble. Torch-free.
#include <array>
#include <cstdint>
#include <span>
#include <string>

namespace tessera::quant {

enum class FourBitType { NF4, FP4 };

// "nf4" / "fp4"; throws tessera::Error (InvalidInput) naming `field` otherwise.
FourBitType parse_four_bit_type(const std::string& name, const std::string& field);
const char* four_bit_type_name(FourBitType type);

// The 16 code values by index, as bitsandbytes' get_4bit_type gives them (normalised to
// [-1, 1]).
const std::array<float, 16>& four_bit_code(FourBitType type);

// Bytes of the packed indices and count of absmax values for `count` values.
inline std::uint64_t four_bit_packed_bytes(std::uint64_t count) {
  return (count + 1) / 2;
}
inline std::uint64_t four_bit_blocks(std::uint64_t count, std::uint64_t blocksize) {
  return (count + blocksize - 1) / blocksize;
}

// Quantizes `values` as bitsandbytes.functional.quantize_4bit does (blocksize 32 … 4096, a
// power of two; a last block shorter than the others has its own absmax; an odd count is padded
// with a zero index pair): `packed` gets four_bit_packed_bytes(values.size()) bytes and `absmax`
// four_bit_blocks(values.size(), blocksize) floats. A value exactly between two codes takes
// the lower one, as torch.bucketize does; an all-zero block has absmax 0 and every index that of
// the code 0. Throws tessera::Error (InvalidInput) on a bad blocksize or span sizes.
void quantize_four_bit(std::span<const float> values, FourBitType type, std::int64_t blocksize,
                       std::span<std::uint8_t> packed, std::span<float> absmax);

// The inverse up to the codes: out[i] = code[index i] × absmax of its block (float32, as
// bitsandbytes.functional.dequantize_4bit computes it before casting to the compute dtype).
void dequantize_four_bit(std::span<const std::uint8_t> packed, std::span<const float> absmax,
                         FourBitType type, std::int64_t blocksize, std::span<float> out);

// dequantize_four_bit's values rounded to bfloat16 (to nearest even, as torch rounds them; NaN
// → 0x7FC0), written as their 16 bits: for a compute dtype of bf16 without a float32 copy.
// Vectorized with AVX-512 where the CPU has it (blocks of a multiple of 32 values), the same
// arithmetic as the scalar path otherwise.
void dequantize_four_bit_bf16(std::span<const std::uint8_t> packed, std::span<const float> absmax,
                              FourBitType type, std::int64_t blocksize,
                              std::span<std::uint16_t> out);

// bitsandbytes' double quantization of the absmax (`bnb_4bit_use_double_quant`): the absmax less
// their mean (`offset`) quantized to 8 bits in blocks of `blocksize2` (256) over a 256-value code
// (the nested `quant_map` a checkpoint carries), each block with a float32 absmax of its own.
// Restores them as dequantize_4bit does: absmax[i] = code[q[i]] × absmax2[i / blocksize2] +
// offset, in float32. Throws tessera::Error (InvalidInput) when the sizes do not match.
void dequantize_nested_absmax(std::span<const std::uint8_t> q, std::span<const float> code,
                              std::span<const float> absmax2, std::int64_t blocksize2, float offset,
                              std::span<float> absmax);

// The same for absmax[first, first + absmax.size()) of the whole set `q` / `absmax2` (a tile of
// a weight's rows): nothing is restored that the tile does not use.
void dequantize_nested_absmax_range(std::span<const std::uint8_t> q, std::span<const float> code,
                                    std::span<const float> absmax2, std::int64_t blocksize2,
                                    float offset, std::uint64_t first, std::span<float> absmax);

// Double quantization as bitsandbytes' quantize_4bit(compress_statistics=True) does it, given
// `offset` (the absmax' float32 mean, which the caller takes as torch does): each absmax less
// the offset, in blocks of `blocksize2`, times the reciprocal of its block's largest magnitude
// (`absmax2`), replaced by an index into `code` (bitsandbytes' 256-value dynamic map) as its CPU
// kernel picks it: the nearest value of the grid point the normalised value rounds to, on a
// grid of 65536 points over [-1, 1]. A block of zeros gets index 0. `q` gets absmax.size()
// indices. Throws tessera::Error (InvalidInput) when the sizes do not fit.
void quantize_nested_absmax(std::span<const float> absmax, float offset,
                            std::span<const float> code, std::int64_t blocksize2,
                            std::span<std::uint8_t> q, std::span<float> absmax2);

}  // namespace tessera::quant
