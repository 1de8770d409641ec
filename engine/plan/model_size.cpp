#include "plan/model_size.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <system_error>

#include "core/error.h"
#include "core/files.h"
#include "hf/families.h"
#include "job/strategies.h"
#include "plan/planner.h"

namespace tessera::plan {
namespace {

namespace fs = std::filesystem;

// to_bytes in planner.cpp saturates here: a category at it is a lower bound.
constexpr std::uint64_t kSaturatedBytes = 18000000000000000000ull;

std::string bytes_text(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
  std::size_t unit = 0;
  while (bytes >= 1024.0 && unit + 1 < std::size(kUnits)) {
    bytes /= 1024.0;
    ++unit;
  }
  char buf[48];
  std::snprintf(buf, sizeof buf, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return buf;
}

// Whole below a million, else three digits and the exponent: "41000", "3.7e9", "1.28e14".
std::string count_text(double n) {
  char buf[48];
  if (n < 1e6) {
    std::snprintf(buf, sizeof buf, "%.0f", n);
    return buf;
  }
  const int exponent = static_cast<int>(std::floor(std::log10(n)));
  std::snprintf(buf, sizeof buf, "%.3g", n / std::pow(10.0, exponent));
  return std::string(buf) + "e" + std::to_string(exponent);
}

// The size field of config.json that makes the model this large: the one which, were it 1,
// would shrink the parameter count the most. Only fields the file writes are named.
struct LargestFactor {
  std::string key;
  std::int64_t value = 0;
};

std::optional<LargestFactor> largest_factor(const hf::ModelConfig& config) {
  const double whole = parameter_count(config);
  hf::ModelConfig probe = config;
  std::optional<LargestFactor> best;
  double best_ratio = 1.0;
  for (const hf::SizeField& field : hf::family_of(config).size_fields) {
    if (!config.raw.contains(field.key) || config.raw.at(field.key).is_null()) continue;
    const std::int64_t value = config.*field.member;
    probe.*field.member = 1;
    const double ratio = whole / std::max(1.0, parameter_count(probe));
    probe.*field.member = value;
    if (ratio > best_ratio) {
      best_ratio = ratio;
      best = LargestFactor{field.key, value};
    }
  }
  return best;
}

// "num_hidden_layers 1000000000 makes a model of 4.1e13 parameters" (or "its sizes make …").
std::string model_phrase(const hf::ModelConfig& config, double parameters) {
  const std::optional<LargestFactor> factor = largest_factor(config);
  return (factor ? factor->key + " " + std::to_string(factor->value) : std::string("its sizes")) +
         " make" + (factor ? "s" : "") + " a model of " + count_text(parameters) + " parameters";
}

std::string size_hint(const hf::ModelConfig& config, const std::string& more) {
  const std::optional<LargestFactor> factor = largest_factor(config);
  return "correct " + (factor ? factor->key : std::string("the model's sizes")) +
         " in config.json (it makes the model this large), or " + more;
}

// "the 23.3 GiB of memory this machine has (20.1 GiB available now)", and the spill folder.
std::string capacity_phrase(const ModelCapacity& capacity) {
  std::string s = "the " + bytes_text(static_cast<double>(capacity.memory_limit())) + " of memory ";
  if (capacity.memory.simulated)
    s += "simulated for this run (--simulate-host-memory)";
  else if (capacity.memory.cgroup_limit && *capacity.memory.cgroup_limit < capacity.memory.total)
    s += "this process's cgroup may use";
  else
    s += "this machine has (" + bytes_text(static_cast<double>(capacity.memory.available)) +
         " available now)";
  if (capacity.spill_dir)
    s += " and the " + bytes_text(static_cast<double>(capacity.spill_free)) +
         " free on disk under " + capacity.spill_dir->string() + " that the strategy may spill to";
  return s;
}

double spill_bytes(const ModelCapacity& capacity) {
  return capacity.spill_dir ? static_cast<double>(capacity.spill_free) : 0.0;
}

[[noreturn]] void refuse_overflow(const hf::ModelConfig& config, const std::string& config_path,
                                  const ModelCapacity& capacity) {
  throw_invalid(
      too_many_parameters(config, config_path) + ", more than " + capacity_phrase(capacity),
      size_hint(config, "check that config.json belongs to this model"));
}

}  // namespace

std::uint64_t ModelCapacity::memory_limit() const {
  if (memory.simulated) return *memory.simulated;
  return memory.cgroup_limit ? std::min(memory.total, *memory.cgroup_limit) : memory.total;
}

ModelCapacity probe_model_capacity(const std::optional<fs::path>& spill_dir) {
  ModelCapacity capacity;
  capacity.memory = probe_memory();
  if (spill_dir) {
    // The folder is made when the strategy first spills: its nearest existing parent tells.
    std::error_code ec;
    const fs::space_info space = fs::space(core::nearest_existing(*spill_dir), ec);
    capacity.spill_dir = *spill_dir;
    capacity.spill_free = ec ? 0 : space.available;
  }
  return capacity;
}

std::optional<fs::path> spill_dir_of(const job::JobSpec& spec) {
  if (spec.strategy.name == job::kAutoStrategy) return fs::path(spec.output.dir);
  if (spec.strategy.name != "gemini") return std::nullopt;
  const auto dir = spec.strategy.options.find("offload_dir");
  if (dir != spec.strategy.options.end() && dir->is_string())
    return fs::path(dir->get<std::string>());
  return fs::path(spec.output.dir) / "offload";
}

std::string too_many_parameters(const hf::ModelConfig& config, const std::string& config_path) {
  return config_path + ": " + model_phrase(config, parameter_count(config)) + ", beyond the " +
         count_text(kMaxParameterCount) + " that 64-bit sizes count";
}

void check_model_fits(const hf::ModelConfig& config, const std::string& config_path,
                      double bytes_per_parameter, const std::string& dtype_name,
                      const ModelCapacity& capacity) {
  const double parameters = parameter_count(config);
  if (!(parameters < kMaxParameterCount)) refuse_overflow(config, config_path, capacity);
  const double needed = parameters * bytes_per_parameter;
  if (needed <= static_cast<double>(capacity.memory_limit()) + spill_bytes(capacity)) return;
  throw_invalid(config_path + ": " + model_phrase(config, parameters) + ": " + bytes_text(needed) +
                    " of weights in " + dtype_name + ", more than " + capacity_phrase(capacity),
                size_hint(config, "load it on a machine with more memory"));
}

void check_model_folder_fits(const fs::path& model_dir, double bytes_per_parameter,
                             const std::string& dtype_name) {
  const fs::path config_path = model_dir / "config.json";
  check_model_fits(hf::load_model_config(config_path), config_path.string(), bytes_per_parameter,
                   dtype_name, probe_model_capacity(std::nullopt));
}

void check_training_fits(const hf::ModelConfig& config, const std::string& config_path,
                         const job::JobSpec& spec, int world_size, const ModelCapacity& capacity) {
  const double parameters = parameter_count(config);
  if (!(parameters < kMaxParameterCount)) refuse_overflow(config, config_path, capacity);
  Settings settings = settings_as_written(spec);
  std::string training = spec.method.type + " fine-tuning in " + spec.precision +
                         " under strategy " + spec.strategy.name;
  if (spec.strategy.name == job::kAutoStrategy) {
    // The least the plan may choose: it trains LoRA instead of full, in bf16, and spills
    // gemini's chunks to disk when nothing else fits.
    settings.method = "lora";
    settings.precision = "bf16";
    settings.strategy = "gemini";
    settings.offload_optim_frac = settings.offload_param_frac = 1.0;
    training = "the least strategy auto may choose (LoRA in bf16 under gemini, spilling to disk)";
  }
  const MemoryEstimate e = estimate_memory(config, settings, 0, 1);
  // Host and disk tiers together: gemini moves bytes between them, it does not shrink them.
  auto tiers = [](std::uint64_t host, std::uint64_t disk) {
    return static_cast<double>(host) + static_cast<double>(disk);
  };
  const double categories[] = {tiers(e.weights, e.disk_weights),
                               tiers(e.gradients, e.disk_gradients),
                               tiers(e.optimizer, e.disk_optimizer)};
  const double needed = categories[0] + categories[1] + categories[2];
  const bool saturated = std::max({e.weights, e.disk_weights, e.gradients, e.disk_gradients,
                                   e.optimizer, e.disk_optimizer}) >= kSaturatedBytes;
  // Several processes: at best every category is sharded over the ranks.
  const double ranks = static_cast<double>(std::max(1, world_size));
  if (needed / ranks <= static_cast<double>(capacity.memory_limit()) + spill_bytes(capacity))
    return;
  std::string figure = std::string(saturated ? "at least " : "") + "weights " +
                       bytes_text(categories[0]) + " + gradients " + bytes_text(categories[1]) +
                       " + optimizer state " + bytes_text(categories[2]) + " = " +
                       bytes_text(needed);
  if (world_size > 1)
    figure += ", " + bytes_text(needed / ranks) + " for each of " + std::to_string(world_size) +
              " processes at best";
  throw_invalid(config_path + ": " + model_phrase(config, parameters) + ": " + training +
                    " needs " + figure + ", more than " + capacity_phrase(capacity),
                size_hint(config, "train it on a machine with more memory"));
}

}  // namespace tessera::plan
