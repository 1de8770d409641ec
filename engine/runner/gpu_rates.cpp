#include "runner/gpu_rates.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace tessera::runner {
namespace {

// Median seconds of `runs` calls of `work`, each followed by a device synchronisation, after one
// untimed call (kernel selection, first-touch of memory).
double median_seconds(int device, int runs, const std::function<void()>& work) {
  work();
  torch::cuda::synchronize(device);
  std::vector<double> seconds;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    work();
    torch::cuda::synchronize(device);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return seconds[seconds.size() / 2];
}

double gemm_flops(const torch::Device& device, torch::Dtype dtype, std::int64_t n) {
  const auto options = torch::TensorOptions().device(device).dtype(dtype);
  torch::Tensor a = torch::randn({n, n}, options);
  torch::Tensor b = torch::randn({n, n}, options);
  torch::Tensor c = torch::empty({n, n}, options);
  const double s = median_seconds(device.index(), 5, [&] { torch::mm_out(c, a, b); });
  return 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) / s;
}

}  // namespace

plan::GpuRates measure_gpu_rates(int index, std::uint64_t copy_bytes, std::int64_t gemm_size) {
  plan::GpuRates rates;
  if (!torch::cuda::is_available() || index >= static_cast<int>(torch::cuda::device_count())) {
    rates.method = "not measured: LibTorch sees no CUDA device " + std::to_string(index);
    return rates;
  }
  const torch::Device device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
  const auto bytes = static_cast<std::int64_t>(copy_bytes);
  torch::Tensor host =
      torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(true));
  host.fill_(7);  // never time untouched pages
  torch::Tensor gpu =
      torch::empty({bytes}, torch::TensorOptions().dtype(torch::kUInt8).device(device));
  rates.host_to_device_bytes_per_s =
      static_cast<double>(bytes) / median_seconds(index, 5, [&] { gpu.copy_(host, true); });
  rates.device_to_host_bytes_per_s =
      static_cast<double>(bytes) / median_seconds(index, 5, [&] { host.copy_(gpu, true); });
  host = torch::Tensor();
  gpu = torch::Tensor();
  // fp32 as the engine computes it: full precision, not TF32 (LibTorch's default).
  const bool allow_tf32 = at::globalContext().allowTF32CuBLAS();
  at::globalContext().setAllowTF32CuBLAS(false);
  rates.fp32_flops = gemm_flops(device, torch::kFloat32, gemm_size);
  at::globalContext().setAllowTF32CuBLAS(allow_tf32);
  bool bf16 = false;
  try {
    rates.bf16_flops = gemm_flops(device, torch::kBFloat16, gemm_size);
    bf16 = true;
  } catch (const c10::Error&) {
    rates.bf16_flops = 0.0;  // a GPU without bf16 matrix products
  }
  rates.copy_bytes = copy_bytes;
  rates.gemm_size = gemm_size;
  rates.method = "LibTorch on cuda:" + std::to_string(index) + ": pinned copies of " +
                 std::to_string(copy_bytes >> 20) + " MiB each way, " + std::to_string(gemm_size) +
                 "³ products in fp32 (no TF32)" + (bf16 ? " and bf16" : "") +
                 "; medians of 5 after a warm-up";
  rates.measured = true;
  return rates;
}

}  // namespace tessera::runner

namespace tessera::runner {

plan::CpuRate measure_cpu_rate(std::int64_t n) {
  torch::Tensor a = torch::randn({n, n});
  torch::Tensor b = torch::randn({n, n});
  torch::Tensor c = torch::empty({n, n});
  torch::mm_out(c, a, b);  // warm-up: threads started, pages touched
  std::vector<double> seconds;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    torch::mm_out(c, a, b);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(seconds.begin(), seconds.end());
  plan::CpuRate rate;
  rate.gemm_flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n) /
                    seconds[seconds.size() / 2];
  rate.method = "LibTorch's fp32 " + std::to_string(n) + "³ product on " +
                std::to_string(torch::get_num_threads()) + " threads, median of 5";
  return rate;
}

}  // namespace tessera::runner
