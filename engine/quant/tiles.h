#pragma once
// How a quantized linear layer computes (engine/model/quantized_linear): a tile of about this
// many of its weight's values (rows in forward, columns in backward) is dequantized to the
// compute dtype at a time, so the planner can count that workspace without the model layer.
#include <cstdint>

namespace tessera::quant {

inline constexpr std::int64_t kDequantizeTileElements = std::int64_t{1} << 20;

}  // namespace tessera::quant
