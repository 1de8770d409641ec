#pragma once
// Encodings of float32 values for GGUF tensor data, bit for bit as ggml's reference code:
//   f16   IEEE half, round to nearest even (overflow to ±inf, NaN stays NaN)
//   bf16  the high 16 bits of the float32, round to nearest even
//   q8_0  blocks of 32 values: an f16 scale d = max|x| / 127, then 32 int8 q = round(x / d)
//         (x · (1/d) in float32, halves away from zero; an all-zero block has d = 0, q = 0).
//         Dequantized x̂ = f16(d) · q, so |x − x̂| ≤ d/2 + 127·|d − f16(d)| ≤ amax/254 + amax/2048
//         for a block whose scale is a normal f16 (amax ≥ 127 · 2^-14).
// Torch-free; every output is little-endian.
#include <cstdint>
#include <span>

namespace tessera::exporter::gguf {

std::uint16_t float_to_half(float value);
float half_to_float(std::uint16_t half);
std::uint16_t float_to_bfloat16(float value);

// `out` holds values.size() * 2 bytes.
void encode_f16(std::span<const float> values, std::uint8_t* out);
void encode_bf16(std::span<const float> values, std::uint8_t* out);
// values.size() must be a multiple of 32; `out` holds values.size() / 32 * 34 bytes.
void quantize_q8_0(std::span<const float> values, std::uint8_t* out);
// The inverse: `blocks` of 34 bytes into blocks.size() / 34 * 32 floats.
void dequantize_q8_0(std::span<const std::uint8_t> blocks, float* out);

}  // namespace tessera::exporter::gguf
