#pragma once
// 8-bit row-wise quantization of frozen weights (issue 27's `int8`), in the weight format of
// bitsandbytes' LLM.int8 (`Int8Params`: `weight` int8 and `SCB`, each row's largest magnitude):
// each value × (127 / its row's absmax), rounded half to even. Torch-free.
#include <cstdint>
#include <span>

namespace tessera::quant {

// Quantizes a rows × cols row-major matrix as bitsandbytes.functional.int8_vectorwise_quant
// (threshold 0) does: `out` rows × cols int8, `row_absmax` rows floats. A row of zeros gives
// zeros. Throws tessera::Error (InvalidInput) when the spans do not match.
void quantize_int8_rows(std::span<const float> values, std::int64_t rows, std::int64_t cols,
                        std::span<std::int8_t> out, std::span<float> row_absmax);

// 1 / 127 as int8_vectorwise_dequant multiplies by it (float32).
inline constexpr float kInt8Inverse127 = 7.874015718698502e-3f;

// out = q × absmax × (1 / 127) in float32, as int8_vectorwise_dequant computes it.
void dequantize_int8_rows(std::span<const std::int8_t> q, std::span<const float> row_absmax,
                          std::int64_t rows, std::int64_t cols, std::span<float> out);

}  // namespace tessera::quant
