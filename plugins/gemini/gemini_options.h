#pragma once
// Gemini's options (job spec strategy.options; validated by job/strategies.h), read once:
// placement, the shares on disk and, with a device tier,
// in host memory, the budgets, the offload folder and the chunk size.
#include <cstdint>
#include <filesystem>
#include <optional>

namespace tessera::train {
struct PluginOptions;
}

namespace tessera::plugins {

struct GeminiOptions {
  // Placement auto: every parameter chunk (shard) has its place on disk — or, with a device
  // tier, in host memory — and after the first step the cache of them grows to what the budget
  // leaves beside the rest of the process.
  bool auto_placement = false;
  double offload_optim_frac = 0.0;  // the share of optimizer bytes on disk
  double offload_param_frac = 0.0;  // the share of parameter bytes on disk (auto: all)
  std::uint64_t host_budget = 0;    // auto: the machine's memory unless the job names one
  std::filesystem::path offload_dir;
  std::optional<std::uint64_t> chunk_bytes;  // none: "auto"
  // With a device tier: the shares of parameter and optimizer bytes kept in host memory (the rest
  // on the device), and the device memory the chunks may use (0: what the GPU has free).
  double host_param_frac = 0.0;
  double host_optim_frac = 0.0;
  std::uint64_t device_budget = 0;
};

// `parts` names what the plugin places ("chunks" or "shards") in its refusals.
GeminiOptions parse_gemini_options(const train::PluginOptions& options, const char* parts);

}  // namespace tessera::plugins
