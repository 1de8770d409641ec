// The planner's reading of a job spec (plan/spec_settings.h) and the conversions between a spec
// and a plan's settings (plan/planner.h: apply_settings, settings_from_json, applied_changes, ...).
#include "plan/spec_settings.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/units.h"
#include "job/strategies.h"
#include "plan/plan_text.h"
#include "plan/planner.h"
#include "plan/step_times.h"
#include "plan/strategy_costs.h"

namespace tessera::plan {

using nlohmann::json;

// Where a named strategy computes on a machine with `gpus` GPUs, as its plugin decides
// (job::device_for): "cpu", "cuda" or "simulated".
std::string device_of(const job::JobSpec& spec, int processes, int processes_per_node, int gpus) {
  const std::string device =
      job::strategy_option(spec.strategy.name, spec.strategy.options, "device");
  return job::device_for(spec.strategy.name, device, processes, processes_per_node, gpus).device;
}

// gemini's device tier: on a GPU (device "cuda", or "auto" where one is present and the options
// allow it), or on the tests' simulated device (which the job layer accepts only where
// TESSERA_SIMULATED_DEVICE allows it); over several processes, sharded with a GPU per rank.
bool gemini_device_tier(const job::JobSpec& spec, int gpus, int processes, int processes_per_node) {
  if (spec.strategy.name != "gemini") return false;
  const std::string device = device_of(spec, processes, processes_per_node, gpus);
  return device == "cuda" || (device == "simulated" && job::simulated_device_allowed());
}

// Whether the job computes on the GPU, as the plugins decide: `auto` (one process: single, or
// gemini's device tier when single does not fit) unless its device option says cpu; a named
// strategy where job::device_for puts it on the GPU (one per rank of this machine for ddp and
// zero and hybrid). `auto` over several processes is planned on the CPU (apply_settings says so in
// the device it writes).
bool plans_on_gpu(const job::JobSpec& spec, const HardwareProfile& hw, int processes,
                  int processes_per_node) {
  const int gpus = static_cast<int>(hw.gpus.size());
  if (gpus == 0) return false;
  if (spec.strategy.name == job::kAutoStrategy)
    return processes == 1 &&
           job::strategy_option(spec.strategy.name, spec.strategy.options, "device") != "cpu";
  if (spec.strategy.name == "gemini")
    return gemini_device_tier(spec, gpus, processes, processes_per_node);
  return device_of(spec, processes, processes_per_node, gpus) == "cuda";
}

// A size option of the strategy (already validated by job::validate_strategy): bytes, or a size
// such as "64MiB"; nullopt when absent or "auto".
std::optional<std::uint64_t> size_option(const json& options, const std::string& key) {
  const auto it = options.find(key);
  if (it == options.end()) return std::nullopt;
  if (it->is_number_unsigned()) return it->get<std::uint64_t>();
  if (it->is_string() && *it != "auto")
    return core::parse_byte_size(it->get<std::string>(), "strategy.options." + key);
  return std::nullopt;
}

std::int64_t saturating_mul(std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? INT64_MAX : r;
}

// The spec's own choices as planner settings: method, precision, batch
// as one micro-batch, checkpointing, and gemini's offload share when the spec names gemini.
Settings written_settings(const job::JobSpec& spec, int gpus, int processes,
                          int processes_per_node) {
  Settings s;
  s.method = spec.method.type;
  s.lora_rank = spec.method.lora_rank;
  s.lora_targets = spec.method.lora_targets;
  s.quantize = spec.method.quantize;
  s.double_quant = spec.method.double_quant;
  s.precision = spec.precision;
  s.micro_batch = std::max<std::int64_t>(1, spec.training.batch_size);
  s.gradient_accumulation = std::max<std::int64_t>(1, spec.training.gradient_accumulation);
  s.sequence_length = spec.dataset.max_length;
  s.activation_checkpointing = spec.training.activation_checkpointing;
  // single's option (auto plans single with it too); the other strategies leave them in the file.
  s.frozen_tables_in_file =
      (spec.strategy.name != "single" && spec.strategy.name != job::kAutoStrategy) ||
      job::strategy_option(spec.strategy.name, spec.strategy.options, "frozen_tables") == "file";
  if (const auto& p = spec.method.preference) {
    s.rows_per_example = 2;
    s.reference_forward = p->loss == "dpo" || p->loss == "ipo" || p->loss == "kto";
    s.reference_copy = s.reference_forward && (s.method == "full" || !p->reference.empty());
  }
  if (spec.strategy.name == "gemini") {
    s.strategy = "gemini";
    auto fraction = [&](const char* key) {
      const auto f = spec.strategy.options.find(key);
      return f != spec.strategy.options.end() && f->is_number() ? f->get<double>() : 0.0;
    };
    s.offload_optim_frac = fraction("offload_optim_frac");
    s.offload_param_frac = fraction("offload_param_frac");
    s.device_tier = gemini_device_tier(spec, gpus, processes, processes_per_node);
    s.simulated_device = s.device_tier && job::strategy_option("gemini", spec.strategy.options,
                                                               "device") == "simulated";
    if (s.device_tier) {
      s.host_param_frac = fraction("host_param_frac");
      s.host_optim_frac = fraction("host_optim_frac");
    }
    // Placement auto streams every parameter chunk (shard) from disk (with a device: from host
    // memory) when it must: planned as all of them there (what it needs at least; its cache, or
    // with a device the shards that move there, then grow into what the budget leaves).
    if (spec.strategy.options.value("placement", "static") == "auto")
      (s.device_tier ? s.host_param_frac : s.offload_param_frac) = 1.0;
  }
  if (spec.strategy.name == "ddp") s.strategy = "ddp";
  if (spec.strategy.name == "hybrid") {
    s.strategy = "hybrid";
    s.tp_size = job::hybrid_tensor_parallel_size(spec.strategy.options);
    s.pp_size = job::hybrid_pipeline_parallel_size(spec.strategy.options);
    s.pp_chunks = job::hybrid_pipeline_chunks(spec.strategy.options);
    s.zero_stage = job::hybrid_zero_stage(spec.strategy.options);
    s.sequence_parallel = job::hybrid_sequence_parallel(spec.strategy.options);
  }
  if (spec.strategy.name == "zero") {
    s.strategy = "zero";
    const auto stage = spec.strategy.options.find("stage");
    s.zero_stage = 1;
    if (stage != spec.strategy.options.end() && stage->is_number_integer())
      s.zero_stage = stage->get<int>();
    else if (stage != spec.strategy.options.end() && stage->is_string())
      s.zero_stage = stage->get<std::string>() == "2" ? 2 : 1;
  }
  return s;
}

Settings settings_as_written(const job::JobSpec& spec) {
  return written_settings(spec);
}

StepTimeKey step_time_key(const job::JobSpec& spec, const hf::ModelConfig& model,
                          const HardwareProfile& hw, int processes, int processes_per_node) {
  processes = std::max(1, processes);
  const int per_node = processes_per_node > 0 ? processes_per_node : processes;
  const bool gpu = plans_on_gpu(spec, hw, processes, per_node);
  Settings s = written_settings(spec, static_cast<int>(hw.gpus.size()), processes, per_node);
  if (s.precision == "bf16" && !(gpu ? hw.gpus[0].bf16 : hw.cpu.native_bf16()))
    s.precision = "fp32";
  return {step_time_device(hw, gpu), model_fingerprint(model), s, processes};
}

namespace {

// Calls `moved(key, given, planned)` for each of gemini's shares that `s` (a plan of `spec`,
// which names gemini) holds at another value than the spec gives.
template <typename Moved>
void for_each_moved_share(const job::JobSpec& spec, const Settings& s, Moved moved) {
  const Settings given = written_settings(spec, s.device_tier ? 1 : 0);
  const std::pair<const char*, double Settings::*> shares[] = {
      {"host_optim_frac", &Settings::host_optim_frac},
      {"host_param_frac", &Settings::host_param_frac},
      {"offload_optim_frac", &Settings::offload_optim_frac},
      {"offload_param_frac", &Settings::offload_param_frac}};
  for (const auto& [key, share] : shares)
    if (std::abs(s.*share - given.*share) > 1e-9) moved(key, given.*share, s.*share);
}

// 0.25, 0.5, 1: a share as the spec would write it.
std::string share_text(double share) {
  std::string text = std::to_string(share);
  text.erase(text.find_last_not_of('0') + 1);
  if (text.back() == '.') text.pop_back();
  return text;
}

}  // namespace

job::JobSpec apply_settings(const job::JobSpec& spec, const Settings& s) {
  job::JobSpec out = spec;
  if (out.strategy.name == job::kAutoStrategy) out.strategy.name = job::auto_strategy().name;
  out.method.type = s.method;
  out.method.lora_rank = s.lora_rank;
  if (!s.lora_targets.empty()) out.method.lora_targets = s.lora_targets;
  out.method.quantize = s.method == "lora" ? s.quantize : "none";
  out.method.double_quant = out.method.quantize != "none" && s.double_quant;
  out.precision = s.precision;
  out.training.batch_size = s.micro_batch;
  out.training.gradient_accumulation = s.gradient_accumulation;
  out.training.activation_checkpointing = s.activation_checkpointing;
  // `auto` writes the strategy it planned (when it is not auto's own) with the options its
  // settings take, the device the plan weighed included (the strategies' own "auto" would take
  // GPUs it did not weigh).
  if (spec.strategy.name == job::kAutoStrategy && s.strategy != out.strategy.name)
    out.strategy = written_strategy(s);
  // gemini named: the shares the plan moved.
  if (spec.strategy.name == "gemini" && s.strategy == "gemini")
    for_each_moved_share(spec, s, [&](const char* key, double, double planned) {
      out.strategy.options[key] = planned;
    });
  return out;
}

Settings settings_from_json(const nlohmann::json& j, const std::string& source) {
  Settings s;
  try {
    s.method = j.at("method").get<std::string>();
    if (s.method != "full" && s.method != "lora")
      throw_invalid(source + ": settings.method \"" + s.method + "\" is not full or lora");
    if (j.contains("lora_rank") && !j["lora_rank"].is_null())
      s.lora_rank = j["lora_rank"].get<std::int64_t>();
    // Plans recorded before QLoRA: a dense base.
    s.quantize = j.value("quantize", std::string("none"));
    s.double_quant = j.value("double_quant", false);
    s.precision = j.at("precision").get<std::string>();
    s.micro_batch = j.at("micro_batch").get<std::int64_t>();
    s.gradient_accumulation = j.at("gradient_accumulation").get<std::int64_t>();
    s.activation_checkpointing = j.at("activation_checkpointing").get<bool>();
    s.sequence_length = j.at("sequence_length").get<std::int64_t>();
    // Plans recorded before gemini was planned have neither: single.
    s.strategy = j.value("strategy", std::string("single"));
    s.offload_optim_frac = j.value("offload_optim_frac", 0.0);
    s.offload_param_frac = j.value("offload_param_frac", 0.0);
    // Plans recorded before gemini's device tier was planned: none.
    s.device_tier = j.value("device_tier", false);
    s.host_optim_frac = j.value("host_optim_frac", 0.0);
    s.host_param_frac = j.value("host_param_frac", 0.0);
    s.zero_offload = j.value("zero_offload", false);
    if (j.contains("zero_stage") && !j["zero_stage"].is_null())
      s.zero_stage = j["zero_stage"].get<int>();
    // Plans recorded before hybrid was planned: one of each.
    s.tp_size = j.value("tp_size", 1);
    s.pp_size = j.value("pp_size", 1);
    s.pp_chunks = j.value("pp_chunks", 1);
    s.sequence_parallel = j.value("sequence_parallel", false);
  } catch (const nlohmann::json::exception& e) {
    throw_invalid(source + ": the plan's settings are incomplete (" + e.what() + ")",
                  "delete the file to plan again from the job spec");
  }
  if (s.micro_batch < 1 || s.gradient_accumulation < 1)
    throw_invalid(source + ": settings.micro_batch and gradient_accumulation must be >= 1",
                  "delete the file to plan again from the job spec");
  if (!valid_layout(s) || !(s.offload_optim_frac >= 0.0 && s.offload_optim_frac <= 1.0) ||
      !(s.offload_param_frac >= 0.0 && s.offload_param_frac <= 1.0) ||
      !(s.host_optim_frac >= 0.0 && s.host_optim_frac <= 1.0) ||
      !(s.host_param_frac >= 0.0 && s.host_param_frac <= 1.0))
    throw_invalid(
        source + ": settings.strategy must be one of " + costed_strategies() +
            " (zero_stage 1 or 2 for zero, 0 to 2 for hybrid; tp_size, pp_size and pp_chunks at " +
            "least 1) and " +
            "offload_optim_frac, offload_param_frac, host_optim_frac and host_param_frac " +
            "within 0 … 1",
        "delete the file to plan again from the job spec");
  return s;
}

std::vector<std::string> applied_changes(const job::JobSpec& spec, const Settings& s) {
  std::vector<std::string> changes;
  if (s.method != spec.method.type)
    changes.push_back("method " + s.method + " instead of " + spec.method.type +
                      (s.method == "lora" ? " (learning rate kept at the spec's value)" : ""));
  const std::string quantize = s.method == "lora" ? s.quantize : "none";
  if (quantize != spec.method.quantize)
    changes.push_back("LoRA on a base quantized to " + quantize +
                      (s.double_quant ? " with double-quantized absmax" : "") +
                      " (QLoRA) instead of a dense one");
  if (s.precision != spec.precision)
    changes.push_back("precision " + s.precision + " instead of " + spec.precision);
  const bool hybrid_chosen = s.strategy == "hybrid" && spec.strategy.name != "hybrid";
  if (hybrid_chosen)
    changes.push_back(
        "strategy " + strategy_phrase(s) + ": each micro-batch of " +
        std::to_string(s.micro_batch) + " is shared by " + std::to_string(s.tp_size * s.pp_size) +
        " ranks, so " + std::to_string(s.gradient_accumulation) +
        " accumulation steps keep the sequences a step trains (each process's " +
        std::to_string(spec.training.batch_size * spec.training.gradient_accumulation) +
        ", as ddp would)");
  else if (s.micro_batch != spec.training.batch_size)
    changes.push_back(
        "micro-batch " + std::to_string(s.micro_batch) + " with " +
        std::to_string(s.gradient_accumulation) + " accumulation steps (the same " +
        std::to_string(spec.training.batch_size * spec.training.gradient_accumulation) +
        " sequences per optimizer step)");
  if (s.activation_checkpointing != spec.training.activation_checkpointing)
    changes.push_back(std::string("activation checkpointing ") +
                      (s.activation_checkpointing ? "on" : "off"));
  if (s.strategy == "gemini" && spec.strategy.name != "gemini")
    changes.push_back(s.device_tier ? "strategy gemini on the GPU with " + in_host_phrase(s) +
                                          " in host memory" +
                                          (s.offload_optim_frac > 0.0 || s.offload_param_frac > 0.0
                                               ? " and " + on_disk_phrase(s) + " on disk"
                                               : std::string())
                                    : "strategy gemini with " + on_disk_phrase(s) + " on disk");
  // gemini named with shares the plan moved further off the device.
  if (s.strategy == "gemini" && spec.strategy.name == "gemini") {
    std::string moved;
    for_each_moved_share(spec, s, [&](const char* key, double given, double planned) {
      moved += std::string(moved.empty() ? "" : ", ") + key + " " + share_text(given) + " → " +
               share_text(planned);
    });
    if (!moved.empty())
      changes.push_back("gemini's shares " + moved + " (" + in_host_phrase(s) + " in host memory" +
                        (s.offload_optim_frac > 0.0 || s.offload_param_frac > 0.0
                             ? ", " + on_disk_phrase(s) + " on disk)"
                             : std::string(")")));
  }
  return changes;
}

}  // namespace tessera::plan
