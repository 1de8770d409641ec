#pragma once
// What the planner reads from a job spec: the settings it asks for as written, where its strategy
// computes, its size options (internal to engine/plan; the public conversions between a spec and
// settings are in plan/planner.h). Torch-free.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "job/job_spec.h"
#include "plan/profile.h"
#include "plan/settings.h"

namespace tessera::plan {

// Where a named strategy computes on a machine with `gpus` GPUs, as its plugin decides
// (job::device_for): "cpu", "cuda" or "simulated".
std::string device_of(const job::JobSpec& spec, int processes, int processes_per_node, int gpus);
// gemini's device tier: on a GPU (device "cuda", or "auto" where one is present and the options
// allow it), or on the tests' simulated device (which the job layer accepts only where
// TESSERA_SIMULATED_DEVICE allows it); over several processes, sharded with a GPU per rank.
bool gemini_device_tier(const job::JobSpec& spec, int gpus, int processes = 1,
                        int processes_per_node = 1);
// Whether the job computes on the GPU, as the plugins decide (`auto` over several processes is
// planned on the CPU).
bool plans_on_gpu(const job::JobSpec& spec, const HardwareProfile& hw, int processes,
                  int processes_per_node);
// A size option of the strategy (already validated by job::validate_strategy): bytes, or a size
// such as "64MiB"; nullopt when absent or "auto".
std::optional<std::uint64_t> size_option(const nlohmann::json& options, const std::string& key);
// a × b, or INT64_MAX where that overflows.
std::int64_t saturating_mul(std::int64_t a, std::int64_t b);
// The spec's own choices as planner settings: method, precision, batch as
// one micro-batch, checkpointing, and the named strategy's layout and shares.
Settings written_settings(const job::JobSpec& spec, int gpus = 0, int processes = 1,
                          int processes_per_node = 1);

}  // namespace tessera::plan
