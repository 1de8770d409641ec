// QLoRA's base on a GPU: one pass from the packed codes to the dense tile. The torch-ops
// path (QuantizedWeight::dequantize_block_with_ops) widens each packed byte to an int64 index,
// gathers float32 pairs, scales them and casts: some 26 bytes of memory traffic a value for a
// bf16 tile, where reading the codes and writing the tile once, which this kernel does, is 2.5.
// Compiled wherever nvcc exists; executed only on machines with a GPU.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda/dequantize_value.h"
#include "cuda/kernels.h"

namespace tessera::cuda {
namespace {

constexpr int kThreads = 256;
constexpr std::int64_t kMaxGridRows = 65535;  // gridDim.y's limit
constexpr std::int64_t kMaxGridColumns = 4096;

__device__ __forceinline__ void store(float* out, float v) {
  *out = v;
}
__device__ __forceinline__ void store(__nv_bfloat16* out, float v) {
  *out = __float2bfloat16_rn(v);
}
__device__ __forceinline__ void store(__half* out, float v) {
  *out = __float2half_rn(v);
}

// One value a thread; rows on the grid's y (striding past its limit), columns on x. Adjacent
// threads read the same or adjacent bytes and write adjacent values.
template <typename Out>
__global__ void four_bit_kernel(const FourBitBlock b, Out* __restrict__ out) {
  __shared__ float code[16];
  if (threadIdx.x < 16) code[threadIdx.x] = b.code[threadIdx.x];
  __syncthreads();
  const WeightRegion& w = b.region;
  for (std::int64_t r = blockIdx.y; r < w.rows; r += gridDim.y) {
    const std::int64_t row_start = (w.first_row + r) * w.in_features + w.first_col;
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         c < w.cols; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
      store(out + r * w.cols + c, four_bit_value(b, code, row_start + c));
  }
}

template <typename Out>
__global__ void int8_kernel(const Int8Block b, Out* __restrict__ out) {
  const WeightRegion& w = b.region;
  for (std::int64_t r = blockIdx.y; r < w.rows; r += gridDim.y)
    for (std::int64_t c = static_cast<std::int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
         c < w.cols; c += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
      store(out + r * w.cols + c, int8_value(b, w.first_row + r, w.first_col + c));
}

dim3 grid_of(std::int64_t rows, std::int64_t cols) {
  const std::int64_t x = std::min<std::int64_t>((cols + kThreads - 1) / kThreads, kMaxGridColumns);
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(std::min(rows, kMaxGridRows)));
}

template <typename Block, template <typename> class Launch>
int launch(const Block& block, DequantizedType type, void* out, void* stream) {
  if (block.region.rows <= 0 || block.region.cols <= 0) return 0;
  const dim3 grid = grid_of(block.region.rows, block.region.cols);
  const auto s = static_cast<cudaStream_t>(stream);
  (void)cudaGetLastError();  // what follows reports this launch alone
  switch (type) {
    case DequantizedType::Float32:
      Launch<float>::run(grid, s, block, static_cast<float*>(out));
      break;
    case DequantizedType::BFloat16:
      Launch<__nv_bfloat16>::run(grid, s, block, static_cast<__nv_bfloat16*>(out));
      break;
    case DequantizedType::Float16:
      Launch<__half>::run(grid, s, block, static_cast<__half*>(out));
      break;
    default:
      return static_cast<int>(cudaErrorInvalidValue);
  }
  return static_cast<int>(cudaGetLastError());
}

template <typename Out>
struct FourBitLaunch {
  static void run(dim3 grid, cudaStream_t s, const FourBitBlock& b, Out* out) {
    four_bit_kernel<Out><<<grid, kThreads, 0, s>>>(b, out);
  }
};
template <typename Out>
struct Int8Launch {
  static void run(dim3 grid, cudaStream_t s, const Int8Block& b, Out* out) {
    int8_kernel<Out><<<grid, kThreads, 0, s>>>(b, out);
  }
};

}  // namespace

int dequantize_four_bit(const FourBitBlock& block, DequantizedType type, void* out, void* stream) {
  if (block.blocksize <= 0 || (block.absmax == nullptr && block.nested_blocksize <= 0))
    return static_cast<int>(cudaErrorInvalidValue);
  return launch<FourBitBlock, FourBitLaunch>(block, type, out, stream);
}

int dequantize_int8(const Int8Block& block, DequantizedType type, void* out, void* stream) {
  return launch<Int8Block, Int8Launch>(block, type, out, stream);
}

}  // namespace tessera::cuda
