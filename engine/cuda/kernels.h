#pragma once
// Hand-written CUDA kernels the engine dispatches to for CUDA tensors. The header is
// plain C++17 (no CUDA types) so that CPU-only translation units and nvcc both include it.
#include <cstdint>

namespace tessera::cuda {

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight, one block per row, fp32
// accumulation. `stream` is a cudaStream_t. Returns a CUDA error code (0 = success).
int rms_norm_forward_f32(const float* x, const float* weight, float* y, std::int64_t rows,
                         std::int64_t cols, float eps, void* stream);

// The dtype a dequantization writes.
enum class DequantizedType : int { Float32 = 0, BFloat16 = 1, Float16 = 2 };

// Rows [first_row, first_row + rows) × columns [first_col, first_col + cols) of a weight
// [*, in_features].
struct WeightRegion {
  std::int64_t in_features = 0;
  std::int64_t first_row = 0, rows = 0, first_col = 0, cols = 0;
};

// A region of a weight held in bitsandbytes' 4-bit layout (model/quantized_linear.h): two values a
// byte of `codes`, the first in the high nibble, the row-major weight's values in blocks of
// `blocksize` with an absmax each, `absmax` one float a block or, double-quantized, restored as
// nested_code[nested_codes[b]] × nested_scales[b / nested_blocksize] + nested_offset.
struct FourBitBlock {
  const std::uint8_t* codes = nullptr;
  const float* absmax = nullptr;  // null when double-quantized
  const std::uint8_t* nested_codes = nullptr;
  const float* nested_code = nullptr;  // [256]
  const float* nested_scales = nullptr;
  std::int64_t nested_blocksize = 256;
  float nested_offset = 0.0f;
  float code[16] = {};  // the value of each nibble (NF4 or FP4)
  std::int64_t blocksize = 64;
  WeightRegion region;
};

// A region of an int8 weight with each row's absmax (bitsandbytes' LLM.int8 layout):
// (q × row_absmax) × inverse_127.
struct Int8Block {
  const std::int8_t* codes = nullptr;
  const float* row_absmax = nullptr;
  float inverse_127 = 0.0f;
  WeightRegion region;
};

// Dequantizes the block into `out` (rows × cols, row-major, `type`) as the CPU's loops do: each
// value × its absmax in float32, rounded once to `type` (to nearest, ties to even), no fused
// multiply-add, so that the bits are the CPU's. `stream` is a cudaStream_t. Returns a CUDA
// error code (0 = success).
int dequantize_four_bit(const FourBitBlock& block, DequantizedType type, void* out, void* stream);
int dequantize_int8(const Int8Block& block, DequantizedType type, void* out, void* stream);

}  // namespace tessera::cuda
