#include "export/gguf_quant.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "core/error.h"

namespace tessera::exporter::gguf {
namespace {

void put_u16(std::uint8_t* out, std::uint16_t v) {
  out[0] = static_cast<std::uint8_t>(v & 0xFF);
  out[1] = static_cast<std::uint8_t>(v >> 8);
}

}  // namespace

std::uint16_t float_to_half(float value) {
  std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = bits & 0x80000000u;
  bits ^= sign;
  std::uint32_t half = 0;
  constexpr std::uint32_t kFloatInf = 0xFFu << 23;
  constexpr std::uint32_t kHalfOverflow = (127u + 16u) << 23;  // 2^16: past the largest half
  constexpr std::uint32_t kHalfMinNormal = 113u << 23;         // 2^-14
  if (bits >= kHalfOverflow) {
    half = bits > kFloatInf ? 0x7E00u : 0x7C00u;  // NaN stays NaN, the rest is inf
  } else if (bits < kHalfMinNormal) {
    // Subnormal or zero: adding 0.5 shifts the value's bits to where a half's subnormal
    // mantissa sits, and the float addition rounds to nearest even on the way.
    constexpr std::uint32_t kMagic = 126u << 23;
    const float shifted = std::bit_cast<float>(bits) + std::bit_cast<float>(kMagic);
    half = std::bit_cast<std::uint32_t>(shifted) - kMagic;
  } else {
    // Normal: rebias the exponent and drop 13 mantissa bits, rounding to nearest even (a carry
    // out of the mantissa bumps the exponent, up to inf past 65504).
    const std::uint32_t odd = (bits >> 13) & 1u;
    bits += ((15u - 127u) << 23) + 0xFFFu + odd;
    half = bits >> 13;
  }
  return static_cast<std::uint16_t>(half | (sign >> 16));
}

float half_to_float(std::uint16_t half) {
  const std::uint32_t sign = std::uint32_t(half & 0x8000u) << 16;
  const std::uint32_t exponent = (half >> 10) & 0x1Fu;
  const std::uint32_t mantissa = half & 0x3FFu;
  if (exponent == 0) {
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 0x1F)
    return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exponent + 127u - 15u) << 23) | (mantissa << 13));
}

std::uint16_t float_to_bfloat16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u)
    return static_cast<std::uint16_t>((bits >> 16) | 0x40u);  // a quiet NaN
  return static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

void encode_f16(std::span<const float> values, std::uint8_t* out) {
  for (std::size_t i = 0; i < values.size(); ++i) put_u16(out + 2 * i, float_to_half(values[i]));
}

void encode_bf16(std::span<const float> values, std::uint8_t* out) {
  for (std::size_t i = 0; i < values.size(); ++i)
    put_u16(out + 2 * i, float_to_bfloat16(values[i]));
}

void quantize_q8_0(std::span<const float> values, std::uint8_t* out) {
  constexpr std::size_t kBlock = 32;
  if (values.size() % kBlock != 0)
    throw Error(ErrorKind::Internal, "q8_0 needs whole blocks of 32 values");
  for (std::size_t b = 0; b < values.size() / kBlock; ++b) {
    const float* x = values.data() + b * kBlock;
    std::uint8_t* block = out + b * 34;
    float amax = 0.0f;
    for (std::size_t j = 0; j < kBlock; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float inverse = d != 0.0f ? 1.0f / d : 0.0f;
    put_u16(block, float_to_half(d));
    for (std::size_t j = 0; j < kBlock; ++j) {
      const float q = std::round(x[j] * inverse);  // halves away from zero, as roundf
      block[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
    }
  }
}

void dequantize_q8_0(std::span<const std::uint8_t> blocks, float* out) {
  for (std::size_t b = 0; b < blocks.size() / 34; ++b) {
    const std::uint8_t* block = blocks.data() + b * 34;
    const float d = half_to_float(static_cast<std::uint16_t>(block[0] | (block[1] << 8)));
    for (std::size_t j = 0; j < 32; ++j)
      out[b * 32 + j] = d * static_cast<float>(static_cast<std::int8_t>(block[2 + j]));
  }
}

}  // namespace tessera::exporter::gguf
