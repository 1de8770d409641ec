// tessera-cli profile [--json]: what this machine offers a training job — CPU and ISA, cores,
// RAM and the cgroup limit, free disk with its measured speed, GPUs with their measured copy and
// compute rates, OS.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "command.h"
#include "core/error.h"
#include "core/files.h"
#include "plan/profile.h"
#if TESSERA_WITH_TORCH
#include "runner/gpu_rates.h"
#include "runner/loopback_link.h"
#endif

namespace tessera::cli {

// Shared with cmd_plan.cpp: the profile options both commands accept.
plan::HardwareProfile profile_from_args(const Args& args, std::filesystem::path disk_dir,
                                        bool measure_disk, bool measure_link);
void print_profile(const plan::HardwareProfile& profile);

namespace {
namespace fs = std::filesystem;
using core::human_bytes;
using nlohmann::json;

std::string speed(double bytes_per_s) {
  return human_bytes(static_cast<std::uint64_t>(bytes_per_s)) + "/s";
}

int run_profile(const std::vector<std::string>& raw) {
  Args args(raw, {"--json", "--no-disk", "--no-link", "--no-cache"},
            {"--dir", "--disk-bytes", "--simulate-host-memory"});
  if (!args.positionals().empty()) throw UsageError{"profile takes no positional arguments"};
  const fs::path dir = args.option("--dir") ? fs::path(*args.option("--dir")) : fs::path(".");
  const plan::HardwareProfile profile =
      profile_from_args(args, dir, !args.flag("--no-disk"), !args.flag("--no-link"));
  if (args.flag("--json"))
    std::cout << plan::to_json(profile).dump(2) << "\n";
  else
    print_profile(profile);
  return 0;
}

const RegisterCommand kProfileCommand{{
    "profile",
    "profile [--json] [--dir DIR] [--no-disk] [--no-link] [--no-cache] [--disk-bytes SIZE] "
    "[--simulate-host-memory SIZE]",
    "Show the CPU, RAM, disk (measured speed), the link between two local ranks (measured), GPUs "
    "and OS that a training job can use",
    run_profile,
}};

}  // namespace

plan::HardwareProfile profile_from_args(const Args& args, std::filesystem::path disk_dir,
                                        bool measure_disk, bool measure_link) {
  plan::ProfileOptions options;
#if TESSERA_WITH_TORCH
  // A 2-rank c10d all_reduce on the loopback (runner/loopback_link.h), cached a day.
  if (measure_link) options.measure_link = [] { return runner::measure_loopback_link(); };
  // Each GPU's copy and compute rates (runner/gpu_rates.h), cached a day.
  options.measure_gpu = [](int index) { return runner::measure_gpu_rates(index); };
  options.measure_cpu = [](int cores) { return runner::measure_cpu_rate(cores); };
#else
  (void)measure_link;  // a build without LibTorch has no c10d to measure the link with
#endif
  options.disk_dir = disk_dir;
  options.measure_disk = measure_disk;
  options.use_cache = !args.flag("--no-cache");
  if (const std::string* bytes = args.option("--disk-bytes"))
    options.disk_test_bytes = plan::parse_byte_size(*bytes, "--disk-bytes");
  bool progress_shown = false;
  options.progress = [&](const std::string& phase, double fraction) {
    std::fprintf(stderr, "\rmeasuring %s speed: %3.0f%%", phase.c_str(), fraction * 100.0);
    progress_shown = true;
  };
  plan::HardwareProfile profile = plan::probe_hardware(options);
  if (progress_shown) std::fprintf(stderr, "\n");
  if (const std::string* simulated = args.option("--simulate-host-memory"))
    profile.memory.simulated = plan::parse_byte_size(*simulated, "--simulate-host-memory");
  return profile;
}

void print_profile(const plan::HardwareProfile& p) {
  auto line = [](const std::string& key, const std::string& value) {
    std::printf("%-14s %s\n", (key + ":").c_str(), value.c_str());
  };
  std::string isa;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!isa.empty()) isa.push_back(' ');
    isa.append(name);
  };
  add(p.cpu.avx2, "avx2");
  add(p.cpu.fma, "fma");
  add(p.cpu.avx512f, "avx512f");
  add(p.cpu.avx512_bf16, "avx512_bf16");
  add(p.cpu.amx_bf16, "amx_bf16");
  line("cpu", p.cpu.model.empty() ? "unknown" : p.cpu.model);
  line("isa", (isa.empty() ? "none of avx2/fma/avx512f/avx512_bf16/amx_bf16" : isa) +
                  (p.cpu.native_bf16() ? " (native bf16)" : " (no native bf16)"));
  line("cores", std::to_string(p.cpu.physical_cores) + " physical, " +
                    std::to_string(p.cpu.logical_cores) + " logical");
  char flops[64];
  std::snprintf(flops, sizeof flops, "%.0f GFLOP/s fp32", p.cpu_flops / 1e9);
  line("cpu compute", std::string(flops) + " (" + p.flops_source + ")");
  if (p.cpu_adam_elements_per_s > 0.0) {
    char adam[48];
    std::snprintf(adam, sizeof adam, "%.0f M elements/s", p.cpu_adam_elements_per_s / 1e6);
    line("cpu adam", std::string(adam) + " (" + p.cpu_adam_source + ")");
  } else {
    line("cpu adam", "not measured");
  }
  line("ram",
       human_bytes(p.memory.total) + " total, " + human_bytes(p.memory.available) + " available");
  line("cgroup limit", p.memory.cgroup_limit ? human_bytes(*p.memory.cgroup_limit) : "none");
  if (p.memory.simulated) line("usable ram", human_bytes(*p.memory.simulated) + " (simulated)");
  if (p.disk) {
    const auto& d = *p.disk;
    line("disk", d.path + ": " + human_bytes(d.free) + " free");
    if (d.measured)
      line("disk speed", "write " + speed(d.write_bytes_per_s) + ", read " +
                             speed(d.read_bytes_per_s) + " (" + human_bytes(d.test_bytes) + ", " +
                             (d.from_cache ? "cached from " : "measured ") + d.measured_at + ")");
    else
      line("disk speed", "not measured");
  }
  if (p.gpus.empty()) {
    line("gpus", "none (looked in " + p.gpu_source + ")");
  } else {
    for (std::size_t i = 0; i < p.gpus.size(); ++i) {
      const plan::GpuInfo& g = p.gpus[i];
      line("gpu " + std::to_string(i),
           g.name + ", " + (g.memory ? human_bytes(g.memory) : std::string("memory unknown")) +
               (g.memory_free ? " (" + human_bytes(g.memory_free) + " free)" : "") +
               (g.compute_capability.empty() ? "" : ", compute " + g.compute_capability) +
               (g.bf16 ? ", bf16" : ""));
      if (!g.rates.measured) continue;
      char rates[160];
      std::snprintf(
          rates, sizeof rates,
          "%.1f TFLOP/s bf16, %.1f TFLOP/s fp32; pinned copies %s/s "
          "to it, %s/s back",
          g.rates.bf16_flops / 1e12, g.rates.fp32_flops / 1e12,
          human_bytes(static_cast<std::uint64_t>(g.rates.host_to_device_bytes_per_s)).c_str(),
          human_bytes(static_cast<std::uint64_t>(g.rates.device_to_host_bytes_per_s)).c_str());
      line("gpu " + std::to_string(i) + " rates",
           std::string(rates) + " (" + (g.rates.from_cache ? "cached from " : "measured ") +
               g.rates.measured_at + ")");
    }
  }
  if (p.link) {
    char link[96];
    std::snprintf(link, sizeof link, "%s/s, latency %.3f ms",
                  human_bytes(static_cast<std::uint64_t>(p.link->bandwidth_bytes_per_s)).c_str(),
                  p.link->latency_s * 1e3);
    line("rank link", std::string(link) + " (" + p.link->method + ", " +
                          (p.link->from_cache ? "cached from " : "measured ") +
                          p.link->measured_at + ")");
  } else {
    line("rank link", "not measured");
  }
  line("os", p.os);
}

}  // namespace tessera::cli
