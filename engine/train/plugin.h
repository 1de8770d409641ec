#pragma once
// A Plugin decides where parameters, gradients and optimizer state live and how a step runs;
// the trainer owns no parameter storage (shared/DESIGN.md). The trainer calls, per step:
// backward() once per micro-batch (the last one says so), then step(); it reads memory() for the
// `memory` event and trainable_weights() / optimizer_state() / load_state() for checkpoints.
//
// The plugins themselves live in plugins/ (one folder and target each: `single`, one process on
// the CPU or CUDA device 0) and are built by name through train/plugin_registry.h.
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "model/dropout.h"
#include "model/model.h"
#include "optim/adamw.h"
#include "train/checkpoint.h"

namespace tessera::dist {
class ParallelContext;
class ProcessGroup;
}  // namespace tessera::dist

namespace tessera::train {

using optim::NamedTensor;

// The float32 masters and loss scaling every plugin shares are train/mixed_precision.h.
// fp32: everything in float32. bf16: parameters (and so activations) in bfloat16, float32
// master copies of the trainable parameters, float32 gradients for the update and float32
// optimizer state. fp16: like bf16 with dynamic loss scaling; CUDA only.
enum class Precision { Fp32, Bf16, Fp16 };
Precision precision_from_name(const std::string& name);  // fp32|bf16|fp16 (and long forms)
const char* precision_name(Precision precision);
// The dtype a precision computes in: float32, bfloat16 or float16.
torch::Dtype compute_dtype_of(Precision precision);

// Where this process stands among the job's processes: data parallelism gives each rank a share
// of the batch (and ZeRO a share of the state); tensor and pipeline parallelism add their
// groups here. Plugins that do not distribute refuse world_size above 1.
struct ProcessContext {
  int rank = 0;
  int world_size = 1;
  // Set when world_size is above 1 (engine/dist): the job's runtime, which owns the groups, and
  // the data-parallel group this rank reduces gradients over (the world, until tensor and
  // pipeline parallelism split it). Not owned: `parallel` keeps it alive.
  std::shared_ptr<dist::ParallelContext> parallel;
  dist::ProcessGroup* data_group = nullptr;
  // Strategies that split the model over tensor-parallel ranks (hybrid): this rank's tensor
  // group (tp innermost: ranks r … r + tp - 1 of a (world / tp) × tp mesh); the data group then
  // holds the ranks of the same tensor coordinate, which read different batches.
  dist::ProcessGroup* tensor_group = nullptr;
  // Strategies that cut the model into pipeline stages (hybrid): the ranks holding the other
  // stages with this rank's data and tensor coordinates (a dp × pp × tp mesh), group rank =
  // stage.
  dist::ProcessGroup* pipeline_group = nullptr;
};

// Throws Unsupported unless `process` is one process (plugins that do not distribute yet).
void require_one_process(const ProcessContext& process, const std::string& plugin);

struct PluginOptions {
  ProcessContext process;
  Precision precision = Precision::Fp32;
  optim::AdamWOptions adamw;
  std::string device = "auto";  // auto | cpu | cuda (the job spec's strategy.options.device)
  // The job spec's strategy.options as written (validated by job/strategies.h), for plugins
  // with options of their own.
  nlohmann::json strategy_options = nlohmann::json::object();
  // The run folder, for plugins that keep files (gemini's default offload folder).
  std::filesystem::path run_dir;
  // Set for plugins that read_deferred_weights() when the model's parameters have no values
  // yet: where to read them from, during prepare() only.
  std::shared_ptr<const model::DeferredWeights> deferred_weights;
  // Where a plugin says what the user should know (level "info" | "warning"), e.g. an option
  // that has nothing to do on this machine. May be empty.
  std::function<void(const std::string& level, const std::string& message)> log;
};

// Where a plugin computes (job::device_for with this machine's GPUs and the process's ranks):
// "cuda" (then rank_cuda_device gives the GPU), "simulated", or "cpu" — where "auto" stays on the
// CPU although a GPU is present, a warning through options.log (rank 0) says why.
std::string choose_plugin_device(const PluginOptions& options, const std::string& plugin);

// The device of a plugin computing on the CPU: "cpu" and "auto" are the CPU, "cuda" is refused
// as not supported yet, anything else is invalid (each naming strategy.options.device).
void require_cpu_device(const PluginOptions& options, const std::string& plugin);

// The GPU of this rank for a plugin asked for device "cuda" on several processes (ddp): CUDA
// device LOCAL_RANK, as torchrun places ranks, made the current device. Throws Unsupported
// without a GPU, and InvalidInput when this machine has fewer GPUs than ranks on it.
torch::Device rank_cuda_device(const PluginOptions& options, const std::string& plugin);

// Where a plugin with no device tier computes (ddp, hybrid): rank_cuda_device where
// choose_plugin_device says "cuda", else the CPU (require_cpu_device refusing other devices).
torch::Device cpu_or_rank_cuda_device(const PluginOptions& options, const std::string& plugin);

struct MemoryByCategory {
  std::uint64_t weights = 0;    // every parameter, plus master copies
  std::uint64_t gradients = 0;  // gradient buffers of the trainable parameters during a step
  std::uint64_t optimizer = 0;  // AdamW m and v
};

// What a plugin keeps on disk (gemini's offload folder): the bytes of its files by category,
// and the chunk traffic between disk and host since prepare().
struct DiskTierMemory {
  std::string folder;
  std::uint64_t used = 0;  // bytes of the tier's files
  MemoryByCategory by_category;
  std::uint64_t bytes_read = 0;     // disk → host
  std::uint64_t bytes_written = 0;  // host → disk
};

// What a plugin with a device tier (gemini's chunks on a GPU, or on the simulated device in
// tests) holds in device memory, by category, and the tier's own figures.
struct DeviceTierMemory {
  std::string device;      // "cuda:0", "simulated"
  bool simulated = false;  // the tests' stand-in for a GPU
  std::uint64_t used = 0;  // bytes the tier allocated (the chunks)
  std::uint64_t peak = 0;
  std::uint64_t total = 0;  // its budget
  MemoryByCategory by_category;
  std::uint64_t bytes_to_device = 0;  // chunk traffic since prepare()
  std::uint64_t bytes_to_host = 0;
};

class DeviceTier;  // train/device_tier.h
// The tier's own figures (name, used, peak, budget, traffic) with what the plugin holds there.
DeviceTierMemory device_tier_memory_of(const DeviceTier& tier, const MemoryByCategory& held);

struct StepStats {
  double grad_norm = 0.0;  // global L2 norm before clipping (unscaled)
  bool applied = true;     // false when fp16 loss scaling skipped the step
};

class Plugin {
 public:
  virtual ~Plugin() = default;
  virtual std::string name() const = 0;

  // Places `model` and the trainable tensors (named as they are saved: HF names for full
  // fine-tuning, PEFT names for LoRA adapters; owned by the model or by adapters) on the
  // plugin's device in the compute precision, in place (Tensor::set_data), and creates the
  // optimizer. Every other parameter of the model is frozen.
  virtual void prepare(model::PretrainedModel& model, std::vector<NamedTensor> trainable,
                       const PluginOptions& options) = 0;
  // Whether prepare() fills the model's parameters itself from PluginOptions::deferred_weights
  // (into storage of its own, one tensor at a time); otherwise the trainer loads them first.
  virtual bool reads_deferred_weights() const { return false; }
  virtual torch::Device device() const = 0;
  virtual torch::Dtype compute_dtype() const = 0;
  // The context prepare() was given.
  virtual const ProcessContext& process() const = 0;
  // Whether prepare() accepts a world size above 1 (data parallelism); `tessera-cli launch`
  // refuses a strategy that does not before it starts any rank.
  virtual bool runs_distributed() const { return false; }

  // How the checkpoint state (trainable weights, optimizer state, state_json) divides over the
  // ranks. Replicated: every rank holds all of it, rank 0 writes it once and any number of ranks
  // can resume from it. Sharded (ZeRO): each rank writes and reads back its own part, so only
  // the same number of ranks can resume (until checkpoints have a layout-free form).
  enum class StateLayout { Replicated, Sharded };
  virtual StateLayout state_layout() const { return StateLayout::Replicated; }
  // Sharded plugins: which elements of each whole tensor this rank holds, by checkpoint name
  // (every trainable tensor and its optimizer state, "exp_avg.<name>", "exp_avg_sq.<name>"), so
  // checkpoints are saved by name and element range and read back on any layout
  // (train/checkpoint.h). trainable_weights() / optimizer_state() then return those ranges as
  // flat tensors, and load_state() is given the same ranges (none for an empty one). Replicated
  // plugins hold whole tensors: empty.
  virtual std::map<std::string, StateSlice> state_slices() const { return {}; }

  // Backward of `loss` × multiplier (1 / accumulation steps), times the loss scale for fp16.
  // `last_micro_batch`: no other backward comes before step(), so the gradients are final
  // (where data parallelism reduces them; gemini takes their norms as they arrive).
  virtual void backward(const torch::Tensor& loss, double multiplier, bool last_micro_batch) = 0;
  // A plugin may run a step's micro-batches itself (pipeline parallelism interleaves their
  // forwards and backwards across stages; Colossal-AI's execute_pipeline): then the trainer
  // hands it every micro-batch of the step instead of calling the model and backward() per
  // micro-batch. Each input is on device(); forward and backward of micro-batch i run inside a
  // model::DropoutScope of its stream, its loss × its `multiplier` (its share of the step, as
  // backward() takes it). Returns each micro-batch's loss, the same on every rank. The last
  // backward ends as backward(…, last_micro_batch) would.
  struct MicroBatch {
    model::ForwardInput input;
    model::DropoutStream dropout;
    double multiplier = 1.0;
  };
  virtual bool runs_micro_batches() const { return false; }
  virtual std::vector<double> run_micro_batches(std::vector<MicroBatch>& micro_batches);
  // Such a plugin's loss for one batch without gradients (evaluation), on every rank.
  virtual double evaluation_loss(const model::ForwardInput& input);
  // Seconds the last run_micro_batches() spent waiting for other ranks (a pipeline's bubble).
  virtual double last_schedule_idle_seconds() const { return 0.0; }

  // Clips (max_grad_norm > 0), updates with AdamW at `lr`, and clears the gradients. A plugin
  // may return with part of the update still running behind the next forward (gemini's
  // optimizer chunks on disk); every other call waits for it where it must.
  virtual StepStats step(double lr, double max_grad_norm) = 0;
  // Waits for what step() left running (the trainer calls it after the last step, so that the
  // step's time and the last memory report include all of it).
  virtual void settle() {}

  virtual MemoryByCategory memory() const = 0;
  // The disk tier, for plugins that have one.
  virtual std::optional<DiskTierMemory> disk_memory() const { return std::nullopt; }
  // The device tier, for plugins that manage one; then memory() is host memory only.
  virtual std::optional<DeviceTierMemory> device_tier_memory() const { return std::nullopt; }
  // A plugin computing on a GPU without a device tier: the part of memory() that lives in host
  // memory (zero's offloaded optimizer); the rest is on the GPU.
  virtual MemoryByCategory host_share() const { return {}; }
  // After the last step: frees the optimizer state and the float32 masters of lower-precision
  // training, so the export has that memory. No step or checkpoint may follow.
  virtual void release_training_state() = 0;

  // Reading the trained weights (the export, the LoRA merge). A plugin may keep parameters out
  // of memory (gemini's chunks on disk): then weights_in_memory() is false and they are read
  // with visit_weights() — each in memory for the call, about a chunk at a time — or brought
  // into the model's parameters with gather_weights() when they fit.
  using WeightVisit = std::function<void(const std::string& name, const torch::Tensor& value)>;
  virtual bool weights_in_memory() const { return true; }
  // Every parameter of `model` by its named_parameters() name, in that order, with its value in
  // the compute dtype.
  virtual void visit_weights(model::PretrainedModel& model, const WeightVisit& visit) {
    for (const auto& item : model.named_parameters()) visit(item.key(), item.value());
  }
  virtual void gather_weights() {}

  // Checkpoint state. Trainable weights are the float32 masters. Not const: a plugin may first
  // bring what it holds elsewhere up to date (gemini writes changed chunks back to their files).
  virtual std::vector<NamedTensor> trainable_weights() = 0;
  virtual std::vector<NamedTensor> optimizer_state() = 0;
  virtual nlohmann::json state_json() const = 0;  // optimizer step count, loss scale
  // Restores all three; `source` names the checkpoint folder in errors.
  virtual void load_state(const std::map<std::string, torch::Tensor>& weights,
                          const std::map<std::string, torch::Tensor>& optimizer,
                          const nlohmann::json& state, const std::string& source) = 0;
};

}  // namespace tessera::train
