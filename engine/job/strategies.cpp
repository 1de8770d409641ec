#include "job/strategies.h"

#include <cmath>
#include <cstdlib>

#include "core/error.h"
#include "core/text.h"
#include "core/units.h"

namespace tessera::job {
namespace {

std::string join(const std::vector<std::string>& items, const std::string& separator) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : separator) + item;
  return out;
}

std::string describe_options(const StrategyInfo& info) {
  if (info.options.empty()) return info.name + " takes no options";
  std::vector<std::string> parts;
  for (const auto& o : info.options) {
    switch (o.kind) {
      case StrategyOption::Kind::Choice:
        parts.push_back(o.key + " (" + join(o.values, " | ") + ")");
        break;
      case StrategyOption::Kind::Fraction:
        parts.push_back(o.key + " (0 … 1)");
        break;
      case StrategyOption::Kind::Size:
        parts.push_back(o.key + " (auto | a size such as 64MiB)");
        break;
      case StrategyOption::Kind::Path:
        parts.push_back(o.key + " (a folder)");
        break;
    }
  }
  return info.name + " takes: " + join(parts, ", ");
}

const StrategyInfo& resolve(const std::string& name) {
  if (name == kAutoStrategy) return auto_strategy();
  const StrategyInfo* info = find_strategy(name);
  if (info == nullptr)
    throw Error(ErrorKind::Internal, "strategy \"" + name + "\" is not in the strategy table");
  return *info;
}

StrategyOption choice(std::string key, std::string description, std::vector<std::string> values,
                      std::vector<std::string> not_yet = {}) {
  return {std::move(key), std::move(description), std::move(values), StrategyOption::Kind::Choice,
          std::move(not_yet)};
}
StrategyOption literal_choice(std::string key, std::string description,
                              std::vector<std::string> values,
                              std::vector<std::string> not_yet = {}) {
  StrategyOption option =
      choice(std::move(key), std::move(description), std::move(values), std::move(not_yet));
  option.literal = true;
  return option;
}
StrategyOption fraction(std::string key, std::string description) {
  return {std::move(key), std::move(description), {}, StrategyOption::Kind::Fraction, {}};
}
StrategyOption size(std::string key, std::string description) {
  return {std::move(key), std::move(description), {}, StrategyOption::Kind::Size, {}};
}
StrategyOption path(std::string key, std::string description) {
  return {std::move(key), std::move(description), {}, StrategyOption::Kind::Path, {}};
}

void validate_option_value(const std::string& at, const std::string& key,
                           const StrategyOption& option, const nlohmann::json& value) {
  const std::string field = at + "strategy.options." + key;
  switch (option.kind) {
    case StrategyOption::Kind::Choice: {
      const bool comparable =
          option.literal ? value.is_number_integer() || value.is_boolean() : value.is_string();
      const std::string text = !comparable      ? ""
                               : option.literal ? value.dump()
                                                : value.get<std::string>();
      if (key == "device" && text == "simulated" && simulated_device_allowed()) return;
      for (const auto& v : option.not_yet)
        if (comparable && text == v)
          throw_unsupported(field + " is " + value.dump() + ", which is not supported yet",
                            key + ": " + option.description);
      for (const auto& v : option.values)
        if (comparable && text == v) return;
      throw_invalid(
          field + " is " + value.dump() + "; expected one of: " + join(option.values, ", "),
          key + ": " + option.description);
    }
    case StrategyOption::Kind::Fraction: {
      if (!value.is_number() || !(value.get<double>() >= 0.0 && value.get<double>() <= 1.0))
        throw_invalid(field + " is " + value.dump() + "; expected a number from 0 to 1",
                      key + ": " + option.description);
      return;
    }
    case StrategyOption::Kind::Size: {
      if (value.is_number_unsigned() && value.get<std::uint64_t>() > 0) return;
      if (value.is_string() && value.get<std::string>() == "auto") return;
      if (value.is_string()) {
        core::parse_byte_size(value.get<std::string>(), field);
        return;
      }
      throw_invalid(field + " is " + value.dump() + "; expected \"auto\" or a size",
                    "write it like 64MiB, or a number of bytes");
    }
    case StrategyOption::Kind::Path:
      if (value.is_string() && !value.get<std::string>().empty()) return;
      throw_invalid(field + " is " + value.dump() + "; expected a folder path",
                    key + ": " + option.description);
  }
}

// gemini's options together: shares of one kind of bytes that add up to more than all of them,
// a placement that decides what an option fixes, and device-tier options on the CPU.
void validate_gemini_options(const std::string& at, const nlohmann::json& options) {
  const auto fraction = [&](const char* key) {
    const auto it = options.find(key);
    return it != options.end() && it->is_number() ? it->get<double>() : 0.0;
  };
  for (const char* kind : {"param", "optim"}) {
    const std::string host = std::string("host_") + kind + "_frac";
    const std::string disk = std::string("offload_") + kind + "_frac";
    const double total = fraction(host.c_str()) + fraction(disk.c_str());
    if (total > 1.0 + 1e-9)
      throw_invalid(at + "strategy.options." + host + " and " + disk + " add up to " +
                        std::to_string(static_cast<int>(std::lround(total * 100))) + "% of the " +
                        (kind == std::string("param") ? "parameter" : "optimizer-state") + " bytes",
                    "give shares that add up to 1 at most");
  }
  if (options.value("placement", "static") == "auto" && options.contains("offload_param_frac"))
    throw_invalid(at + "strategy.options.offload_param_frac: placement \"auto\" decides where "
                       "parameter chunks live",
                  "remove offload_param_frac, or use placement \"static\" to fix the share on "
                  "disk");
  if (options.value("device", "auto") == "cpu")
    for (const char* key : {"host_param_frac", "host_optim_frac", "device_budget"})
      if (options.contains(key))
        throw_invalid(at + "strategy.options." + key +
                          ": with device \"cpu\" there is no device "
                          "tier (host_param_frac, host_optim_frac and device_budget place and "
                          "size chunks on a GPU)",
                      std::string("remove ") + key +
                          " (offload_param_frac and offload_optim_frac place chunks on disk), "
                          "or use device \"cuda\"");
}

}  // namespace

const std::vector<StrategyInfo>& strategies() {
  static const std::vector<StrategyInfo> table = {
      {"single",
       "one process on one device: CUDA device 0 when present, else the CPU",
       {choice("device",
               "where it trains: auto (CUDA device 0 when present, else the CPU), cpu or cuda",
               {"auto", "cpu", "cuda"}),
        choice("frozen_tables",
               "LoRA's frozen input embedding and output head (when not tied) on the CPU: file "
               "(left in the checkpoint file and read as used, never held in memory) or memory "
               "(loaded: no reads from the file a step, the output head computed as other "
               "strategies compute it)",
               {"file", "memory"})},
       /*planned=*/true,
       /*distributes=*/false,
       /*quantized_base=*/true,
       /*preference=*/true},
      {"gemini",
       "parameters and optimizer state in chunks placed on the host or on disk (Colossal-AI's "
       "Gemini); on several processes every chunk sharded over them (ZeRO-3), each rank's "
       "shards placed the same way",
       {choice("device",
               "where it computes: cpu, or cuda (the device tier: chunks on the GPU, in host "
               "memory or on disk; a GPU per rank on several processes); auto: cuda where this "
               "machine has a GPU for each of its ranks, else the CPU",
               {"auto", "cpu", "cuda"}),
        choice("placement",
               "where chunks live: static (the offload fractions decide) or auto (every "
               "parameter chunk may stream from disk; after the first step as many stay in "
               "memory as host_budget leaves room for)",
               {"static", "auto"}),
        fraction("offload_optim_frac", "the share of optimizer-state bytes kept on disk"),
        fraction("offload_param_frac",
                 "the share of parameter bytes kept on disk, fetched block by block as the "
                 "model uses them"),
        path("offload_dir", "the folder for the disk tier (default: the run folder's offload/)"),
        size("chunk_size", "bytes per chunk: auto (searched to waste the least) or a size"),
        size("host_budget",
             "the RAM the whole training process may use: auto (what the machine has) or a "
             "size, shared by the ranks on one machine; a job that cannot run within it is "
             "refused before loading"),
        size("device_budget",
             "with device cuda: the GPU memory the chunks may use: auto (what it has free) or a "
             "size"),
        fraction("host_param_frac",
                 "with device cuda: the share of parameter bytes kept in host memory, brought to "
                 "the GPU block by block as the model uses them"),
        fraction("host_optim_frac",
                 "with device cuda: the share of optimizer-state bytes kept in host memory and "
                 "updated by the CPU Adam (the rest is updated on the GPU)")},
       /*planned=*/true,
       /*distributes=*/true,
       /*quantized_base=*/true,
       /*preference=*/true},
      {"ddp",
       "data parallelism: every process a whole replica on its share of the batch, gradients "
       "averaged over the processes in buckets while backward runs (PyTorch's DDP)",
       {choice("device",
               "where it computes: cpu, or cuda (rank r on GPU LOCAL_RANK, gradients reduced by "
               "NCCL); auto: the GPUs when this machine has one for each of its ranks, else "
               "the CPU",
               {"auto", "cpu", "cuda"}),
        size("bucket_size",
             "bytes of float32 gradients per all-reduce: auto (25MiB) or a size; smaller "
             "buckets start communicating earlier in backward, larger ones make fewer calls")},
       /*planned=*/true,
       /*distributes=*/true,
       /*quantized_base=*/true,
       /*preference=*/true},
      {"zero",
       "data parallelism with the optimizer state (stage 1) and the gradients (stage 2) sharded "
       "over the processes: each updates its share, then the weights are all-gathered (ZeRO)",
       {choice("device",
               "where it computes: cpu, or cuda (rank r on GPU LOCAL_RANK, gradients "
               "reduce-scattered and weights all-gathered by NCCL); auto: the GPUs when this "
               "machine has one for each of its ranks, else the CPU",
               {"auto", "cpu", "cuda"}),
        literal_choice("stage",
                       "1: the float32 masters and AdamW moments sharded; 2: the gradients too, "
                       "reduce-scattered while backward runs",
                       {"1", "2"}),
        literal_choice("offload_optimizer",
                       "with device cuda: keep the shard's masters and moments in host memory, "
                       "updated by the CPU Adam (on the CPU they are there already: a warning "
                       "says so)",
                       {"false", "true"}),
        size("bucket_size",
             "bytes of float32 gradients per reduce-scatter (stage 2) or all-reduce (stage 1): "
             "auto (25MiB) or a size")},
       /*planned=*/true,
       /*distributes=*/true,
       /*quantized_base=*/true,
       /*preference=*/true},
      {"hybrid",
       "tensor and pipeline parallelism combined with data parallelism: each layer's weights "
       "split over tp_size processes (Megatron-style: attention by heads, the MLP by its inner "
       "width, the embedding and head by the vocabulary), the layers cut into pp_size stages "
       "balanced by cost and run in the 1F1B order over the step's micro-batches, and the "
       "processes / (tp_size × pp_size) replicas of that split averaging their gradients",
       {choice("device",
               "where it computes: cpu, or cuda (rank r on GPU LOCAL_RANK; the tensor and data "
               "groups' collectives by NCCL, the pipeline's activations and gradients through "
               "host memory); auto: the GPUs when this machine has one for each of its ranks, "
               "else the CPU",
               {"auto", "cpu", "cuda"}),
        literal_choice("tp_size",
                       "processes each layer is split over: 2 (the default), 1, 4 or 8; it must "
                       "divide the number of processes and the model's heads, kv heads, MLP "
                       "width and vocabulary",
                       {"2", "1", "4", "8"}),
        literal_choice("pp_size",
                       "pipeline stages the layers are cut into: 1 (the default), 2, 4 or 8; "
                       "tp_size × pp_size must divide the number of processes, and the model "
                       "needs a layer per stage",
                       {"1", "2", "4", "8"}),
        literal_choice("pp_chunks",
                       "model chunks per pipeline stage: 1 (the default: 1F1B), 2 or 4 "
                       "(interleaved 1F1B: the bubble shrinks by this factor, the activations "
                       "sent grow by it); needs pp_size × pp_chunks layers and a "
                       "gradient_accumulation that pp_size divides",
                       {"1", "2", "4"}),
        literal_choice("zero_stage",
                       "0 (the default): every replica keeps the float32 masters and AdamW "
                       "moments of its blocks; 1: ZeRO-1 over the data-parallel replicas, each "
                       "keeping and updating 1 / dp of them, the updated weights all-gathered; "
                       "2: ZeRO-2, also the gradients: each micro-batch's reduce-scattered in "
                       "buckets as backward runs, each replica keeping the float32 average of "
                       "its 1 / dp only",
                       {"0", "1", "2"}),
        literal_choice("sequence_parallel",
                       "true: Megatron-LM's sequence parallelism with tp_size above 1 — the "
                       "layers' norms, dropout and residuals compute on 1 / tp of the positions, "
                       "all-gather and reduce-scatter replacing the all-reduces (activation "
                       "memory ÷ tp there; more bytes sent: the positions are gathered again in "
                       "backward); with pp_size above 1 the stages pass each rank's block",
                       {"false", "true"})},
       /*planned=*/true,
       /*distributes=*/true,
       /*quantized_base=*/false,
       /*preference=*/false},
  };
  return table;
}

const StrategyInfo* find_strategy(const std::string& name) {
  for (const auto& s : strategies())
    if (s.name == name) return &s;
  return nullptr;
}

bool strategy_can(const std::string& name, bool StrategyInfo::*capability) {
  const StrategyInfo* s = find_strategy(name);
  return s != nullptr && s->*capability;
}

std::string strategies_that_can(bool StrategyInfo::*capability) {
  std::vector<std::string> names;
  for (const auto& s : strategies())
    if (s.*capability) names.push_back(s.name);
  return core::alternatives(names);
}

const StrategyInfo& auto_strategy() {
  for (const auto& s : strategies())
    if (s.planned) return s;
  throw Error(ErrorKind::Internal, "the strategy table has no strategy the planner models");
}

bool simulated_device_allowed() {
  const char* value = std::getenv("TESSERA_SIMULATED_DEVICE");
  return value != nullptr && std::string(value) == "1";
}

bool tests_share_gpu() {
  const char* value = std::getenv("TESSERA_TESTS_SHARE_GPU");
  return value != nullptr && std::string(value) == "1";
}

DeviceChoice device_for(const std::string& strategy, const std::string& device, int processes,
                        int processes_per_node, int gpus) {
  if (device != "auto") return {device, ""};
  if (gpus <= 0) return {"cpu", ""};
  const bool sharded_gemini = strategy == "gemini" && processes > 1;
  if (strategy == "ddp" || strategy == "zero" || strategy == "hybrid" || sharded_gemini) {
    // Every rank must agree, and a machine cannot see another's GPUs.
    if (processes > processes_per_node)
      return {"cpu",
              "the ranks run on several machines, which may not all have GPUs; device "
              "cuda trains on them where every node has a GPU for each of its ranks"};
    if (processes_per_node <= gpus) return {"cuda", ""};
    return {"cpu", std::to_string(processes_per_node) + " ranks on this machine but " +
                       std::to_string(gpus) + " GPU(s): each rank needs a GPU of its own"};
  }
  return {"cuda", ""};  // single, gemini's device tier (and what the planner resolves auto to)
}

int hybrid_tensor_parallel_size(const nlohmann::json& options) {
  if (!options.is_object() || !options.contains("tp_size")) return 2;
  return options["tp_size"].get<int>();
}

int hybrid_pipeline_parallel_size(const nlohmann::json& options) {
  if (!options.is_object() || !options.contains("pp_size")) return 1;
  return options["pp_size"].get<int>();
}

int hybrid_pipeline_chunks(const nlohmann::json& options) {
  if (!options.is_object() || !options.contains("pp_chunks")) return 1;
  return options["pp_chunks"].get<int>();
}

bool hybrid_sequence_parallel(const nlohmann::json& options) {
  return options.is_object() && options.contains("sequence_parallel") &&
         options["sequence_parallel"].is_boolean() && options["sequence_parallel"].get<bool>();
}

int hybrid_zero_stage(const nlohmann::json& options) {
  if (!options.is_object() || !options.contains("zero_stage")) return 0;
  return options["zero_stage"].get<int>();
}

std::string strategy_names() {
  std::vector<std::string> names;
  for (const auto& s : strategies()) names.push_back(s.name);
  return join(names, ", ");
}

void validate_strategy(const std::string& name, const nlohmann::json& options,
                       const std::string& source) {
  const std::string at = source.empty() ? "" : source + ": ";
  const StrategyInfo* info = name == kAutoStrategy ? &auto_strategy() : find_strategy(name);
  if (info == nullptr)
    throw_invalid(at + "strategy.name is \"" + name +
                      "\", which is not a strategy this build has; expected one of: " +
                      std::string(kAutoStrategy) + ", " + strategy_names(),
                  "available plugins: " + strategy_names() + " (or auto, which lets the " +
                      "planner choose; see docs/job-spec.md)");
  if (!options.is_object()) throw_invalid(at + "strategy.options must be an object");
  for (const auto& [key, value] : options.items()) {
    const StrategyOption* option = nullptr;
    for (const auto& o : info->options)
      if (o.key == key) option = &o;
    if (option == nullptr)
      throw_invalid(
          at + "strategy.options." + key + " is not an option of strategy \"" + name + "\"",
          "remove it; " + describe_options(*info));
    validate_option_value(at, key, *option, value);
  }
  if (info->name == "gemini") validate_gemini_options(at, options);
}

std::string strategy_option(const std::string& name, const nlohmann::json& options,
                            const std::string& key) {
  const StrategyInfo& info = resolve(name);
  for (const auto& o : info.options) {
    if (o.key != key) continue;
    if (options.is_object()) {
      auto it = options.find(key);
      if (it != options.end() && it->is_string()) return it->get<std::string>();
      if (it != options.end() && o.literal) return it->dump();
    }
    if (o.values.empty())
      throw Error(ErrorKind::Internal, "strategy option \"" + key + "\" has no default string");
    return o.values.front();
  }
  throw Error(ErrorKind::Internal, "strategy \"" + info.name + "\" has no option \"" + key + "\"");
}

}  // namespace tessera::job
