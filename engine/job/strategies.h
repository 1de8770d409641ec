#pragma once
// The strategy table: every strategy (plugin) a job spec may name in strategy.name, with a
// one-line description and its options. Torch-free, so the job spec parser, the planner and the
// GUI share it. The torch-side factories that build the plugins are registered under the same
// names in engine/train/plugin_registry.h (by plugins/, see plugins/README.md); an entry here
// without a factory there is a bug that tests/unit/test_train.cpp catches.
//
// `auto` is not in the table: it is the planner's pseudo-strategy, resolved to the table's
// first entry the planner models (plan/planner.h), or with several processes to the planned
// strategy that distributes which fits and is quickest. It takes the first entry's options.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace tessera::job {

inline constexpr const char* kAutoStrategy = "auto";

// One option of a strategy.
//   Choice:   a string from `values` (the first is the default); `not_yet` lists values that are
//             recognised but not supported yet, refused with that said. A `literal` choice
//             takes numbers or booleans (zero's stage 1 | 2, offload_optimizer false | true).
//   Fraction: a number in [0, 1], default 0.
//   Size:     "auto" (the default) or a size, "64MiB" or a number of bytes.
//   Path:     a non-empty string (a folder); the default is the plugin's.
struct StrategyOption {
  enum class Kind { Choice, Fraction, Size, Path };
  std::string key;
  std::string description;
  std::vector<std::string> values;
  Kind kind = Kind::Choice;
  std::vector<std::string> not_yet;
  // Choice only: `values` are JSON numbers or booleans written as text ("1", "true"), matched
  // against the value's JSON form; a string is refused.
  bool literal = false;
};

// Whether this process may use the simulated device (train/device_tier.h): the tests set
// TESSERA_SIMULATED_DEVICE=1. Then every strategy's `device` also takes "simulated".
bool simulated_device_allowed();
// Tests only (TESSERA_TESTS_SHARE_GPU=1): a machine's ranks with device cuda may outnumber its
// GPUs and share them (local rank r on GPU r mod GPUs), their collectives going through host
// memory over Gloo (NCCL refuses two ranks on one GPU): the GPU check's several ranks on its one
// GPU.
bool tests_share_gpu();

// Where a strategy computes, from its `device` option: "cpu", "cuda" or "simulated" as written;
// "auto" is the GPU where this machine has one for each of its `processes_per_node` ranks (and
// every rank is on it: across machines "auto" is the CPU, on which every rank agrees) and
// the strategy has a CUDA path (single; ddp, zero and hybrid; gemini, with any options), else the
// CPU, `why_not_gpu` saying why (empty without a GPU). The plugins, the runner (NCCL groups or not)
// and the planner all decide by it.
struct DeviceChoice {
  std::string device;
  std::string why_not_gpu;
};
DeviceChoice device_for(const std::string& strategy, const std::string& device, int processes,
                        int processes_per_node, int gpus);

struct StrategyInfo {
  std::string name;
  std::string description;  // one line
  std::vector<StrategyOption> options;
  // The planner's cost model covers it (plan/planner.h), so `auto` may resolve to it.
  bool planned = false;
  // It runs as several processes (data parallel over the ranks): with `launch --nproc N` above 1,
  // `auto` chooses among the planned strategies that distribute, and only those run. The
  // torch-side Plugin::runs_distributed() says the same of its plugin.
  bool distributes = false;
  // It trains LoRA on a quantized frozen base (QLoRA, method.quantize or a checkpoint stored
  // quantized), on the CPU or a GPU (the quantized weights move with their layers). The trainer,
  // the runner and the planner all refuse the rest by this.
  bool quantized_base = false;
  // It trains the preference objectives (method.preference).
  bool preference = false;
};

// Whether strategy `name` (a table entry; false for "auto" and unknown names) has `capability`
// (&StrategyInfo::quantized_base, &StrategyInfo::preference), and the strategies that have it as
// "single, ddp, zero or gemini" for messages.
bool strategy_can(const std::string& name, bool StrategyInfo::*capability);
std::string strategies_that_can(bool StrategyInfo::*capability);

// strategy hybrid's tensor-parallel size (strategy.options.tp_size, 2 when absent).
int hybrid_tensor_parallel_size(const nlohmann::json& options);
// strategy hybrid's pipeline stages (strategy.options.pp_size, 1 when absent).
int hybrid_pipeline_parallel_size(const nlohmann::json& options);
// strategy hybrid's model chunks per pipeline stage (strategy.options.pp_chunks, 1 when absent).
int hybrid_pipeline_chunks(const nlohmann::json& options);
// strategy hybrid's ZeRO stage over its data-parallel replicas (strategy.options.zero_stage, 0
// when absent).
int hybrid_zero_stage(const nlohmann::json& options);
// strategy hybrid's sequence parallelism (strategy.options.sequence_parallel, false when absent).
bool hybrid_sequence_parallel(const nlohmann::json& options);

// Every strategy this build has, in the order the docs list them.
const std::vector<StrategyInfo>& strategies();
// nullptr when `name` is not in the table (also for "auto").
const StrategyInfo* find_strategy(const std::string& name);
// The strategy `auto` resolves to and validates its options against.
const StrategyInfo& auto_strategy();
// "single" (every plugin name, comma-separated) for messages.
std::string strategy_names();

// Checks strategy.name ("auto" or a table entry) and strategy.options (a JSON object). Throws
// tessera::Error (InvalidInput) naming strategy.name or strategy.options.<key> after
// `source` (the spec file), with the value and a hint: unknown names and unknown option keys
// are refused, never ignored.
void validate_strategy(const std::string& name, const nlohmann::json& options,
                       const std::string& source);

// The value of option `key` of strategy `name` in `options` (validated), or its default.
// `key` must be one of the strategy's options (Internal error otherwise).
std::string strategy_option(const std::string& name, const nlohmann::json& options,
                            const std::string& key);

}  // namespace tessera::job
