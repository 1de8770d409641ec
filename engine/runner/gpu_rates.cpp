#include "runner/gpu_rates.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "optim/cpu_adam.h"

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

namespace {

double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The shortest of `runs` timings of `work` by `clock`, after one untimed call.
double best_seconds(int runs, double (*clock)(), const std::function<void()>& work) {
  work();
  double best = std::numeric_limits<double>::infinity();
  for (int i = 0; i < runs; ++i) {
    const double t0 = clock();
    work();
    best = std::min(best, clock() - t0);
  }
  return best;
}

std::string gflops_text(double flops) {
  char text[32];
  std::snprintf(text, sizeof text, "%.0f GFLOP/s", flops / 1e9);
  return text;
}

}  // namespace

plan::CpuRate measure_cpu_rate(int physical_cores, std::int64_t n) {
  torch::Tensor a = torch::randn({n, n});
  torch::Tensor b = torch::randn({n, n});
  torch::Tensor c = torch::empty({n, n});
  const double flops =
      2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  const auto product = [&] { torch::mm_out(c, a, b); };
  const int threads = torch::get_num_threads();
  const double every_thread = flops / best_seconds(5, wall_seconds, product);
  // One thread timed by its own CPU clock: what other processes take of the cores does not lower
  // it, while it halves or worse the all-threads figure (threads wait for a descheduled sibling).
  torch::set_num_threads(1);
  const double one_thread = flops / best_seconds(3, thread_cpu_seconds, product);
  torch::set_num_threads(threads);
  const int cores = std::max(1, std::min(threads, physical_cores));
  const double from_one_thread = kCpuThreadScaling * cores * one_thread;
  plan::CpuRate rate;
  rate.gemm_flops = std::max(every_thread, from_one_thread);
  rate.method = "LibTorch's fp32 " + std::to_string(n) + "³ product, best of 5 on " +
                std::to_string(threads) + " threads: " + gflops_text(every_thread) +
                "; one thread over its own CPU time x " + std::to_string(cores) + " cores x " +
                std::to_string(kCpuThreadScaling).substr(0, 4) + ": " +
                gflops_text(from_one_thread) + "; the larger";
  if (from_one_thread > 1.25 * every_thread)
    rate.method += " (other processes held the cores while the threads ran)";

  std::vector<float> param(kCpuAdamElements, 0.5f), grad(kCpuAdamElements, 1e-3f),
      exp_avg(kCpuAdamElements, 0.0f), exp_avg_sq(kCpuAdamElements, 0.0f);
  std::vector<std::uint16_t> copy(kCpuAdamElements);
  optim::AdamArrays arrays;
  arrays.param = param.data();
  arrays.grad = grad.data();
  arrays.exp_avg = exp_avg.data();
  arrays.exp_avg_sq = exp_avg_sq.data();
  arrays.copy = copy.data();
  arrays.copy_kind = optim::LowPrecisionCopy::Bf16;
  arrays.count = kCpuAdamElements;
  std::int64_t step = 0;
  const double adam_seconds = best_seconds(3, wall_seconds, [&] {
    optim::AdamHyper hyper;
    hyper.step = ++step;
    hyper.weight_decay = 0.01;
    optim::cpu_adamw_step(arrays, hyper);
  });
  rate.adam_elements_per_s = static_cast<double>(kCpuAdamElements) / adam_seconds;
  char adam[96];
  std::snprintf(adam, sizeof adam, "%.0f M elements/s", rate.adam_elements_per_s / 1e6);
  rate.adam_method = std::string("the fused CPU Adam (") +
                     optim::simd_level_name(optim::detected_simd_level()) +
                     ", a bf16 copy written) over " + std::to_string(kCpuAdamElements >> 20) +
                     "M elements, best of 3 on " + std::to_string(threads) + " threads: " + adam;
  return rate;
}

}  // namespace tessera::runner
