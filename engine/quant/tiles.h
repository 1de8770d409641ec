#pragma once
// How a quantized linear layer computes and loads (engine/model/quantized_linear): a tile of
// about this many of its weight's values (rows in forward, columns in backward) is dequantized to
// the compute dtype at a time, so the planner can count that workspace without the model layer.
#include <cstdint>

namespace tessera::quant {

// 8 Mi values (16 MiB in bf16): a 1.1B llama's q and o in one tile, its MLP's in two. At 1 Mi the
// tiles were thin matmuls (a band of 128 of the gate's columns), and QLoRA's step took 0.5 s more.
inline constexpr std::int64_t kDequantizeTileElements = std::int64_t{1} << 23;

// A checkpoint's weight is quantized from bands of its rows of about this many values (float32:
// 4 MiB, one buffer reused), never whole in float32.
inline constexpr std::int64_t kQuantizeBandValues = std::int64_t{1} << 20;

}  // namespace tessera::quant
