#pragma once
// The hardware profile: what this machine offers a training job (CPU and its ISA, cores,
// RAM and the cgroup limit, free disk and its measured speed, GPUs, OS). Torch-free, so the
// GUI can link it.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace tessera::plan {

struct CpuInfo {
  std::string model;
  bool avx2 = false, avx512f = false, avx512_bf16 = false, amx_bf16 = false, fma = false;
  int physical_cores = 0;
  int logical_cores = 0;
  double mhz = 0.0;
  bool native_bf16() const { return avx512_bf16 || amx_bf16; }
};

struct MemoryInfo {
  std::uint64_t total = 0;      // MemTotal
  std::uint64_t available = 0;  // MemAvailable
  std::optional<std::uint64_t> cgroup_limit;
  std::optional<std::uint64_t> simulated;  // tests only; shown as simulated wherever it appears
  // What a job may use: the simulated budget, else min(available, cgroup headroom).
  std::uint64_t usable() const;
};

struct DiskInfo {
  std::string path;  // the folder whose filesystem was measured
  std::uint64_t free = 0;
  bool measured = false;
  double write_bytes_per_s = 0.0;
  double read_bytes_per_s = 0.0;
  std::uint64_t test_bytes = 0;
  std::string method;       // how the speed was measured
  std::string measured_at;  // UTC time of the measurement (may come from the cache)
  bool from_cache = false;
};

// The link between ranks: the bus bandwidth and latency of a 2-rank c10d all_reduce (Gloo), the
// time a gradient all_reduce of B bytes takes over W ranks being 2(W-1)/W x B / bandwidth plus
// the latency per call. Measured on the loopback between two local ranks at profile time, or
// given from `tessera-cli nodes check`'s link test between machines.
struct LinkInfo {
  bool measured = false;
  double bandwidth_bytes_per_s = 0.0;  // bytes of the large all_reduce / its median time
  double latency_s = 0.0;              // median of 4-byte all_reduces
  std::uint64_t test_bytes = 0;
  std::string method;       // how it was measured, in words
  std::string measured_at;  // UTC time of the measurement (may come from the cache)
  bool from_cache = false;
};

// What a GPU does, measured with LibTorch on it (the caller supplies the measurement: this library
// is torch-free): copies between pinned host memory and the GPU, and a large matrix product in
// bf16 and in fp32 (TF32 off), each the median of several after a warm-up.
struct GpuRates {
  bool measured = false;
  double host_to_device_bytes_per_s = 0.0;
  double device_to_host_bytes_per_s = 0.0;
  double bf16_flops = 0.0;  // 0 where the GPU has no bf16 (compute capability below 8.0)
  double fp32_flops = 0.0;
  std::uint64_t copy_bytes = 0;  // bytes of each timed copy
  std::int64_t gemm_size = 0;    // n of the n×n×n products
  std::string method;            // how it was measured, in words
  std::string measured_at;       // UTC time of the measurement (may come from the cache)
  bool from_cache = false;
};

struct GpuInfo {
  std::string name;
  std::uint64_t memory = 0;        // total; 0: unknown
  std::uint64_t memory_free = 0;   // free when profiled (nvidia-smi); 0: unknown
  std::string compute_capability;  // "9.0"; empty: unknown
  bool bf16 = false;
  GpuRates rates;  // measured when ProfileOptions::measure_gpu is given (cached a day)
};

struct HardwareProfile {
  CpuInfo cpu;
  MemoryInfo memory;
  std::optional<DiskInfo> disk;
  std::vector<GpuInfo> gpus;
  std::optional<LinkInfo> link;  // absent: not measured (the plan then leaves communication out)
  std::string gpu_source;        // where GPU discovery looked
  std::string os;
  // Sustained fp32 FLOP/s of a training step on the CPU: LibTorch's fp32 matrix product measured
  // on every core (ProfileOptions::measure_cpu) times kCpuSustainedShare, or without a
  // measurement a rough estimate from cores × clock × FMA width × an efficiency factor.
  double cpu_flops = 0.0;
  std::string flops_source;
  bool cpu_flops_measured = false;
  // Elements a second the CPU Adam updates on every core (gemini's update of the optimizer state
  // in host memory beside a GPU), measured with the CPU's rate; 0: not measured.
  double cpu_adam_elements_per_s = 0.0;
  std::string cpu_adam_source;
};

// A CPU's fp32 matrix-product rate as LibTorch computes it on every core, and how it was taken.
struct CpuRate {
  double gemm_flops = 0.0;
  std::string method;
  double adam_elements_per_s = 0.0;  // the fused CPU Adam with a bf16 copy, every thread
  std::string adam_method;
};
// The share of that rate a training step sustains (its products' 6 FLOPs per element and token,
// the input embedding left out, and the attention's, over its wall time): 0.80 and 0.78 measured
// in one process on 2 threads on a 20.8 M-parameter llama (hidden 512, 4 layers, 16 sequences of
// 128 and of 512 tokens a step) on a 2-core AMD EPYC whose product rate was 211 GFLOP/s.
inline constexpr double kCpuSustainedShare = 0.80;

struct ProfileOptions {
  std::optional<std::filesystem::path> disk_dir;  // empty: skip the disk section
  bool measure_disk = true;
  std::uint64_t disk_test_bytes = 128ull << 20;
  bool use_cache = true;  // reuse a disk or link measurement younger than a day
  // Measures the loopback link between two local ranks (LibTorch's c10d, so the caller supplies
  // it: this library is torch-free); unset: the link is not measured.
  std::function<LinkInfo()> measure_link;
  // Measures GPU `index`'s copy and compute rates (LibTorch, so the caller supplies it, as for the
  // link); unset: the rates are not measured (and the planner assumes a rate, saying so).
  std::function<GpuRates(int index)> measure_gpu;
  // Measures the CPU's fp32 matrix-product rate (LibTorch, as above; cached a day); unset: the
  // rate is the rough estimate, said so in flops_source. Given the physical cores.
  std::function<CpuRate(int physical_cores)> measure_cpu;
  std::function<void(const std::string& phase, double fraction)> progress;
};

HardwareProfile probe_hardware(const ProfileOptions& options);
// The memory section alone (/proc/meminfo and the cgroup limit): cheap, for checks before a load.
MemoryInfo probe_memory();
nlohmann::json to_json(const HardwareProfile& profile);

// How measure_disk measures (DiskInfo::method): a cached figure measured otherwise is measured
// again.
inline constexpr const char* kDiskMethod =
    "gemini's disk store in a scratch folder: 32 MiB regions, O_DIRECT, 2 I/O threads, all "
    "regions queued at once, overwrite and read timed";

// Measures write and read speed in `dir` as gemini's disk tier moves its chunks
// (memory/disk_store.h), in a scratch folder removed afterwards.
DiskInfo measure_disk(const std::filesystem::path& dir, std::uint64_t bytes,
                      const std::function<void(const std::string&, double)>& progress);

// "2GiB", "512MiB", "1.5GB", "1000000" → bytes; `what` names the value in errors.
std::uint64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace tessera::plan
