#pragma once
// The size a config.json asks for, judged before any of the model is built: the planner's
// parameter count × bytes per category (weights, gradients, optimizer state) against what this
// machine has, its memory and, for a strategy with a disk tier, the free disk it may spill to.
// A config.json with num_hidden_layers 1e9 is refused in a second, naming the field, instead of
// being allocated until the process is killed. Torch-free: each command calls it before it
// creates a model.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "hf/config.h"
#include "job/job_spec.h"
#include "plan/profile.h"

namespace tessera::plan {

// What this machine offers a model.
struct ModelCapacity {
  MemoryInfo memory;
  // The folder a strategy may spill to (gemini's disk tier) and its free bytes; none without.
  std::optional<std::filesystem::path> spill_dir;
  std::uint64_t spill_free = 0;
  // The memory a model may fill: a simulated budget (tests), else MemTotal or the cgroup's limit
  // when lower. Not what is free now: a model that fits the machine may wait for memory.
  std::uint64_t memory_limit() const;
};

// This machine's memory, and the free disk of `spill_dir` (its nearest existing folder) when
// given.
ModelCapacity probe_model_capacity(const std::optional<std::filesystem::path>& spill_dir);

// Where `spec`'s strategy may spill to disk: gemini's offload_dir (by default RUN/offload), and
// for strategy auto the run folder (the plan may choose gemini); none for the others.
std::optional<std::filesystem::path> spill_dir_of(const job::JobSpec& spec);

// Loading `config` for inference (eval, generate, export): every parameter in
// `bytes_per_parameter` (`dtype_name` names it in the message). Throws tessera::Error
// (InvalidInput) naming `config_path`, the field that makes the model this large with its value,
// the figure, and the memory there is, when it cannot fit or overflows 64-bit sizes.
void check_model_fits(const hf::ModelConfig& config, const std::string& config_path,
                      double bytes_per_parameter, const std::string& dtype_name,
                      const ModelCapacity& capacity);

// The same for the model folder `model_dir` (its config.json, read here) against this machine's
// memory: what eval, generate and export call before they load it.
void check_model_folder_fits(const std::filesystem::path& model_dir, double bytes_per_parameter,
                             const std::string& dtype_name);

// Training `spec` on `world_size` processes: weights, gradients and optimizer state as
// estimate_memory counts them for the spec's settings (strategy auto: the least the plan could
// choose, LoRA in bf16 under gemini), host and disk tiers together, against the memory and the
// spill folder's free disk. Several processes: one rank's share at best (everything sharded).
void check_training_fits(const hf::ModelConfig& config, const std::string& config_path,
                         const job::JobSpec& spec, int world_size, const ModelCapacity& capacity);

// "MODEL/config.json: intermediate_size 4611686018427387904 makes a model of 1.8e+21
// parameters, beyond the 9e+18 that 64-bit sizes count": the message of a config whose count
// passes kMaxParameterCount.
std::string too_many_parameters(const hf::ModelConfig& config, const std::string& config_path);

}  // namespace tessera::plan
