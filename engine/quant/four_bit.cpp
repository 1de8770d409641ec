#include "quant/four_bit.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "core/error.h"
#include "quant/four_bit_simd.h"

namespace tessera::quant {
namespace {

// bitsandbytes' NF4 values (its get_4bit_type, already in [-1, 1]).
constexpr std::array<float, 16> kNf4 = {-1.0f,
                                        -0.6961928009986877f,
                                        -0.5250730514526367f,
                                        -0.39491748809814453f,
                                        -0.28444138169288635f,
                                        -0.18477343022823334f,
                                        -0.09105003625154495f,
                                        0.0f,
                                        0.07958029955625534f,
                                        0.16093020141124725f,
                                        0.24611230194568634f,
                                        0.33791524171829224f,
                                        0.44070982933044434f,
                                        0.5626170039176941f,
                                        0.7229568362236023f,
                                        1.0f};

// FP4 by bit pattern (sign, then the 3 other bits), divided by its largest magnitude, 12, in
// float32 as bitsandbytes does. Its table writes the negative zero as 0: +0, so that a value
// dequantized from it has bitsandbytes' sign (bf16 keeps the sign of a zero).
std::array<float, 16> make_fp4() {
  constexpr std::array<float, 16> raw = {0.0f, 0.0625f,  8.0f,  12.0f,  4.0f,  6.0f,  2.0f,  3.0f,
                                         0.0f, -0.0625f, -8.0f, -12.0f, -4.0f, -6.0f, -2.0f, -3.0f};
  std::array<float, 16> code{};
  for (std::size_t i = 0; i < code.size(); ++i) code[i] = raw[i] / 12.0f;
  return code;
}

// The codes in ascending order with the index each came from, and the 15 midpoints between
// neighbours (float32, (a + b) / 2): a scaled value's index is the number of midpoints below it.
struct Bounds {
  std::array<std::uint8_t, 16> index_of_rank{};
  std::array<float, 15> midpoints{};
};

Bounds make_bounds(const std::array<float, 16>& code) {
  Bounds b;
  std::array<std::uint8_t, 16> order{};
  std::iota(order.begin(), order.end(), std::uint8_t{0});
  // Equal values (FP4's two zeros) keep their index order, as torch.argsort does on 16 values.
  std::stable_sort(order.begin(), order.end(),
                   [&](std::uint8_t a, std::uint8_t c) { return code[a] < code[c]; });
  b.index_of_rank = order;
  for (std::size_t k = 0; k + 1 < order.size(); ++k)
    b.midpoints[k] = (code[order[k]] + code[order[k + 1]]) / 2.0f;
  return b;
}

const Bounds& bounds_of(FourBitType type) {
  static const Bounds nf4 = make_bounds(kNf4);
  static const Bounds fp4 = make_bounds(four_bit_code(FourBitType::FP4));
  return type == FourBitType::NF4 ? nf4 : fp4;
}

// The code index of a scaled value: the number of midpoints below it (torch.bucketize's rank),
// through the ranks' order.
std::uint8_t index_of(const Bounds& bounds, float scaled) {
  // Counted without branches (weights fall anywhere, so a search mispredicts); a NaN is above
  // no midpoint and gets rank 0.
  std::size_t rank = 0;
  for (const float midpoint : bounds.midpoints) rank += midpoint < scaled ? 1 : 0;
  return bounds.index_of_rank[rank];
}

// `count` values in blocks of `blocksize`: a valid block size, and `packed` bytes and `absmax`
// floats to match. `what` names the operation in the message.
void check_layout(std::uint64_t count, std::int64_t blocksize, std::size_t packed,
                  std::size_t absmax, const char* what) {
  if (blocksize < 32 || blocksize > 4096 || (blocksize & (blocksize - 1)) != 0)
    throw_invalid(std::string(what) + ": blocksize " + std::to_string(blocksize) +
                      " is not one of 32, 64, … 4096",
                  "use 64 (bitsandbytes' default)");
  if (packed != four_bit_packed_bytes(count) ||
      absmax != four_bit_blocks(count, static_cast<std::uint64_t>(blocksize)))
    throw_invalid(std::string(what) + ": " + std::to_string(packed) + " packed bytes and " +
                  std::to_string(absmax) + " block scales do not fit " + std::to_string(count) +
                  " values");
}

}  // namespace

FourBitType parse_four_bit_type(const std::string& name, const std::string& field) {
  if (name == "nf4") return FourBitType::NF4;
  if (name == "fp4") return FourBitType::FP4;
  throw_invalid(field + ": \"" + name + "\" is not a 4-bit type", "use \"nf4\" or \"fp4\"");
}

const char* four_bit_type_name(FourBitType type) {
  return type == FourBitType::NF4 ? "nf4" : "fp4";
}

const std::array<float, 16>& four_bit_code(FourBitType type) {
  static const std::array<float, 16> fp4 = make_fp4();
  return type == FourBitType::NF4 ? kNf4 : fp4;
}

void quantize_four_bit(std::span<const float> values, FourBitType type, std::int64_t blocksize,
                       std::span<std::uint8_t> packed, std::span<float> absmax) {
  const std::uint64_t count = values.size();
  check_layout(count, blocksize, packed.size(), absmax.size(), "4-bit quantization");
  const auto block = static_cast<std::uint64_t>(blocksize);
  const Bounds& bounds = bounds_of(type);
  std::fill(packed.begin(), packed.end(), std::uint8_t{0});
  // An odd count's last byte holds the index of a padded 0 in its low nibble.
  if (count % 2 == 1) packed[count / 2] = index_of(bounds, 0.0f);
  for (std::uint64_t b = 0; b * block < count; ++b) {
    const std::uint64_t begin = b * block, end = std::min(count, begin + block);
    float largest = 0.0f;
    for (std::uint64_t i = begin; i < end; ++i) largest = std::max(largest, std::fabs(values[i]));
    absmax[b] = largest;
    // bitsandbytes multiplies by the reciprocal of the full blocks' absmax and divides by the
    // short last block's: the same float32 rounding here.
    const float floor = std::max(largest, 1e-38f);
    const bool full = end - begin == block;
    const float reciprocal = 1.0f / floor;
    for (std::uint64_t i = begin; i < end; ++i) {
      const float scaled = full ? values[i] * reciprocal : values[i] / floor;
      const std::uint8_t index = index_of(bounds, std::clamp(scaled, -1.0f, 1.0f));
      packed[i / 2] = static_cast<std::uint8_t>(
          packed[i / 2] | (i % 2 == 0 ? static_cast<std::uint8_t>(index << 4) : index));
    }
  }
}

void dequantize_four_bit(std::span<const std::uint8_t> packed, std::span<const float> absmax,
                         FourBitType type, std::int64_t blocksize, std::span<float> out) {
  const std::uint64_t count = out.size();
  check_layout(count, blocksize, packed.size(), absmax.size(), "4-bit dequantization");
  const auto block = static_cast<std::uint64_t>(blocksize);
  const std::array<float, 16>& code = four_bit_code(type);
  // Block by block (an even number of values, so each starts on a byte): one scale per block and
  // two values per byte, with no division per value. (A per-block table of the 16 scaled values,
  // looked up per byte, measured 3 to 5 times slower here: 1.8 against 0.4-0.6 ns a value.)
  for (std::uint64_t begin = 0, b = 0; begin < count; begin += block, ++b) {
    const std::uint64_t end = std::min(count, begin + block);
    const float scale = absmax[b];
    const std::uint8_t* bytes = packed.data() + begin / 2;
    float* dest = out.data() + begin;
    const std::uint64_t pairs = (end - begin) / 2;
    for (std::uint64_t k = 0; k < pairs; ++k) {
      const std::uint8_t byte = bytes[k];
      dest[2 * k] = code[byte >> 4] * scale;
      dest[2 * k + 1] = code[byte & 0x0F] * scale;
    }
    if ((end - begin) % 2 == 1) dest[2 * pairs] = code[bytes[pairs] >> 4] * scale;
  }
}

namespace {

std::uint16_t to_bf16_bits(float value) {
  std::uint32_t bits = 0;
  std::memcpy(&bits, &value, sizeof bits);
  if (std::isnan(value)) return 0x7FC0;
  return static_cast<std::uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

}  // namespace

void dequantize_four_bit_bf16(std::span<const std::uint8_t> packed, std::span<const float> absmax,
                              FourBitType type, std::int64_t blocksize,
                              std::span<std::uint16_t> out) {
  const std::uint64_t count = out.size();
  check_layout(count, blocksize, packed.size(), absmax.size(), "4-bit dequantization");
  const auto block = static_cast<std::uint64_t>(blocksize);
  const std::array<float, 16>& code = four_bit_code(type);
  std::uint64_t begin = 0, b = 0;
  if (detail::cpu_has_avx512() && block % 64 == 0) {
    const std::uint64_t whole = count / block;
    detail::four_bit_blocks_to_bf16_avx512(packed.data(), absmax.data(), whole, block, code.data(),
                                           out.data());
    begin = whole * block;
    b = whole;
  }
  for (; begin < count; begin += block, ++b) {
    const std::uint64_t end = std::min(count, begin + block);
    const float scale = absmax[b];
    const std::uint8_t* bytes = packed.data() + begin / 2;
    std::uint16_t* dest = out.data() + begin;
    for (std::uint64_t i = 0; i < end - begin; ++i) {
      const std::uint8_t byte = bytes[i / 2];
      dest[i] = to_bf16_bits(code[i % 2 == 0 ? byte >> 4 : byte & 0x0F] * scale);
    }
  }
}

void dequantize_nested_absmax(std::span<const std::uint8_t> q, std::span<const float> code,
                              std::span<const float> absmax2, std::int64_t blocksize2, float offset,
                              std::span<float> absmax) {
  if (code.size() != 256 || blocksize2 <= 0 || q.size() != absmax.size() ||
      absmax2.size() != four_bit_blocks(q.size(), static_cast<std::uint64_t>(blocksize2)))
    throw_invalid("double-quantized absmax: " + std::to_string(q.size()) + " values, " +
                  std::to_string(absmax2.size()) + " block scales and a code of " +
                  std::to_string(code.size()) + " do not fit blocks of " +
                  std::to_string(blocksize2));
  dequantize_nested_absmax_range(q, code, absmax2, blocksize2, offset, 0, absmax);
}

void dequantize_nested_absmax_range(std::span<const std::uint8_t> q, std::span<const float> code,
                                    std::span<const float> absmax2, std::int64_t blocksize2,
                                    float offset, std::uint64_t first, std::span<float> absmax) {
  if (code.size() != 256 || blocksize2 <= 0 || first + absmax.size() > q.size() ||
      absmax2.size() != four_bit_blocks(q.size(), static_cast<std::uint64_t>(blocksize2)))
    throw_invalid("double-quantized absmax: values [" + std::to_string(first) + ", " +
                  std::to_string(first + absmax.size()) + ") of " + std::to_string(q.size()) +
                  " with " + std::to_string(absmax2.size()) +
                  " block scales do not fit blocks of " + std::to_string(blocksize2));
  const auto block = static_cast<std::uint64_t>(blocksize2);
  for (std::size_t i = 0; i < absmax.size(); ++i) {
    const std::uint64_t at = first + i;
    absmax[i] = code[q[at]] * absmax2[at / block] + offset;
  }
}

void quantize_nested_absmax(std::span<const float> absmax, float offset,
                            std::span<const float> code, std::int64_t blocksize2,
                            std::span<std::uint8_t> q, std::span<float> absmax2) {
  if (code.size() != 256 || blocksize2 <= 0 || q.size() != absmax.size() ||
      absmax2.size() != four_bit_blocks(absmax.size(), static_cast<std::uint64_t>(blocksize2)))
    throw_invalid("double quantization: " + std::to_string(absmax.size()) + " absmax, " +
                  std::to_string(q.size()) + " codes and " + std::to_string(absmax2.size()) +
                  " block scales do not fit blocks of " + std::to_string(blocksize2));
  // bitsandbytes' CPU 8-bit quantization looks the index up on a grid of 65536 points spread
  // evenly over [-1, 1], each point holding the index of its nearest code value (by the
  // midpoints between neighbours); a value takes the grid point it rounds to. Near a midpoint
  // that is not always the nearest code value, and so it is what we do too.
  constexpr std::uint32_t kGrid = 65536;
  std::array<float, 255> midpoints{};
  for (std::size_t i = 0; i + 1 < code.size(); ++i) midpoints[i] = 0.5f * (code[i] + code[i + 1]);
  std::vector<std::uint8_t> nearest(kGrid);
  std::size_t index = 0;
  for (std::uint32_t g = 0; g < kGrid; ++g) {
    const float point = -1.0f + (2.0f * static_cast<float>(g)) / static_cast<float>(kGrid - 1);
    while (index < midpoints.size() && midpoints[index] < point) ++index;
    nearest[g] = static_cast<std::uint8_t>(index);
  }
  const auto block = static_cast<std::size_t>(blocksize2);
  for (std::size_t begin = 0, b = 0; begin < absmax.size(); begin += block, ++b) {
    const std::size_t end = std::min(absmax.size(), begin + block);
    float largest = 0.0f;
    for (std::size_t i = begin; i < end; ++i)
      largest = std::max(largest, std::fabs(absmax[i] - offset));
    absmax2[b] = largest;
    if (largest == 0.0f) {
      std::fill(q.begin() + static_cast<std::ptrdiff_t>(begin),
                q.begin() + static_cast<std::ptrdiff_t>(end), std::uint8_t{0});
      continue;
    }
    const float inverse = 1.0f / largest;
    for (std::size_t i = begin; i < end; ++i) {
      const float x = std::clamp((absmax[i] - offset) * inverse, -1.0f, 1.0f);
      const float grid = (x + 1.0f) * 0.5f * static_cast<float>(kGrid - 1) + 0.5f;
      q[i] = nearest[static_cast<std::uint32_t>(grid)];
    }
  }
}

}  // namespace tessera::quant
