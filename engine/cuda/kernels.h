#pragma once
// Hand-written CUDA kernels the engine dispatches to for CUDA tensors. The header is
// plain C++ (no CUDA types) so that CPU-only translation units can include it.
#include <cstdint>

namespace tessera::cuda {

// y[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * weight, one block per row, fp32
// accumulation. `stream` is a cudaStream_t. Returns a CUDA error code (0 = success).
int rms_norm_forward_f32(const float* x, const float* weight, float* y, std::int64_t rows,
                         std::int64_t cols, float eps, void* stream);

}  // namespace tessera::cuda
