#include "quant/int8_rows.h"

#include <cmath>
#include <string>

#include "core/error.h"

namespace tessera::quant {
namespace {

void check_sizes(std::size_t values, std::size_t stats, std::int64_t rows, std::int64_t cols,
                 const char* what) {
  if (rows < 0 || cols < 0 || values != static_cast<std::size_t>(rows * cols) ||
      stats != static_cast<std::size_t>(rows))
    throw_invalid(std::string(what) + ": sizes do not match a " + std::to_string(rows) + " × " +
                  std::to_string(cols) + " matrix");
}

}  // namespace

void quantize_int8_rows(std::span<const float> values, std::int64_t rows, std::int64_t cols,
                        std::span<std::int8_t> out, std::span<float> row_absmax) {
  check_sizes(values.size(), row_absmax.size(), rows, cols, "int8 quantization");
  if (out.size() != values.size()) throw_invalid("int8 quantization: output size mismatch");
  for (std::int64_t r = 0; r < rows; ++r) {
    const std::span<const float> row =
        values.subspan(static_cast<std::size_t>(r * cols), static_cast<std::size_t>(cols));
    float largest = 0.0f;
    for (float v : row) largest = std::fmax(largest, std::fabs(v));
    row_absmax[static_cast<std::size_t>(r)] = largest;
    // bitsandbytes' 127.0 / row_stats is torch's scalar-over-tensor division: the reciprocal,
    // times 127, in float32 (which can differ from 127 / x in the last bit).
    const float scale = (1.0f / largest) * 127.0f;
    for (std::int64_t c = 0; c < cols; ++c) {
      const float scaled = largest == 0.0f ? 0.0f : row[static_cast<std::size_t>(c)] * scale;
      // Round half to even (the default rounding mode), as torch.round does.
      out[static_cast<std::size_t>(r * cols + c)] =
          static_cast<std::int8_t>(std::nearbyint(scaled));
    }
  }
}

void dequantize_int8_rows(std::span<const std::int8_t> q, std::span<const float> row_absmax,
                          std::int64_t rows, std::int64_t cols, std::span<float> out) {
  check_sizes(q.size(), row_absmax.size(), rows, cols, "int8 dequantization");
  if (out.size() != q.size()) throw_invalid("int8 dequantization: output size mismatch");
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) {
      const auto at = static_cast<std::size_t>(r * cols + c);
      out[at] =
          static_cast<float>(q[at]) * row_absmax[static_cast<std::size_t>(r)] * kInt8Inverse127;
    }
}

}  // namespace tessera::quant
